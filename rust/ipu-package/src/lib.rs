//! The ipu-stack application package: a zstd-compressed tar archive holding
//! `manifest.json`, one image per tile (`tiles/NNNN.img`) and whatever other
//! members the compiler supplies (`report.json`, symbols, ...). The format is
//! specified in docs/package-format.md.
//!
//! Invariants:
//! - Writing is deterministic: the same [`Package`] gives byte-identical files
//!   (manifest first, then members sorted by name; fixed mode, owner and mtime;
//!   fixed zstd level; no timestamps anywhere).
//! - Writing is atomic: the file is written to a temporary sibling and renamed
//!   over the destination, so an error never leaves a partial package.
//! - Reading validates everything (magic and versions, sizes and BLAKE3
//!   digests of every member, tile numbers and counts, placements, image
//!   contents) and reports the member at fault; it never panics on bad input.
//!
//! API boundary: the compiler builds a [`Package`] and calls
//! [`Package::write`]; the loader and `ipu inspect` call [`Package::read`].

mod image;
mod manifest;
mod schedule;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{Read, Write};
use std::path::Path;

pub use image::{ImageError, Segment, TileImage, IMAGE_MAGIC, IMAGE_VERSION};
pub use manifest::{
    natural_element, natural_order, placement_runs, tile_file, transposed_element,
    transposed_order, CallPhase, ConfigWrite, HostInterface, Manifest, MemberEntry, PhaseKind,
    Placement, StreamTensor, StreamingCall, TileEntry, EXIT_COMMAND, FORMAT_VERSION, TARGET,
};
pub use schedule::StepLive;

use ipu_arch::{SRAM_BASE, SRAM_END, TILES_PER_CHIP};

/// The zstd level of every package. Fixed because the level changes the bytes.
pub const ZSTD_LEVEL: i32 = 6;
/// The largest decompressed archive a reader accepts (2 GiB: 1472 full tiles
/// are 0.94 GB), so that a corrupt size cannot exhaust memory.
pub const MAX_ARCHIVE_BYTES: u64 = 2 << 30;
/// The manifest's member name.
pub const MANIFEST: &str = "manifest.json";
/// The member right after the manifest: the manifest's BLAKE3 digest in
/// lowercase hex and a newline. The zstd frame checksum already protects the
/// compressed file; this protects the manifest inside an unpacked archive,
/// where nothing else would (every other member is listed in the manifest
/// with its own digest).
pub const MANIFEST_DIGEST: &str = "manifest.json.blake3";

/// The descriptive part of a package: everything in the manifest except the
/// member listings, which the writer computes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackageInfo {
    /// The compiler that built the package.
    pub compiler_version: String,
    /// Tiles used: 0..tile_count.
    pub tile_count: u32,
    /// Model name.
    pub model: String,
    /// How the host drives the program.
    pub host: HostInterface,
    /// Streaming calls.
    pub calls: Vec<StreamingCall>,
    /// Register writes.
    pub config_writes: Vec<ConfigWrite>,
    /// Compile report figures.
    pub report_summary: BTreeMap<String, u64>,
}

/// A whole package in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Package {
    /// Manifest contents.
    pub info: PackageInfo,
    /// Tile images by tile number.
    pub tiles: BTreeMap<u32, TileImage>,
    /// Other members by name.
    pub members: BTreeMap<String, Vec<u8>>,
}

/// Why a package could not be written or read. Every variant names the
/// member (or file) at fault.
#[derive(Debug)]
pub enum PackageError {
    /// A file system operation failed.
    Io {
        /// The path involved.
        path: String,
        /// What the OS said.
        error: std::io::Error,
    },
    /// The zstd stream is corrupt or truncated.
    Compression(String),
    /// The archive decompresses to more than [`MAX_ARCHIVE_BYTES`].
    TooLarge,
    /// The tar structure is corrupt.
    Archive(String),
    /// The first member is not `manifest.json`.
    ManifestNotFirst {
        /// The first member's name, if any.
        found: Option<String>,
    },
    /// `manifest.json` does not parse.
    ManifestJson(String),
    /// The manifest's format version is not supported.
    UnsupportedFormatVersion(u32),
    /// The manifest's target is not ipu21.
    UnsupportedTarget(String),
    /// A member is not a regular file or has a bad name.
    BadMember {
        /// The member.
        member: String,
        /// Why.
        reason: String,
    },
    /// Two members with one name.
    DuplicateMember(String),
    /// A member the manifest does not list.
    UnlistedMember(String),
    /// A member the manifest lists is absent.
    MissingMember(String),
    /// Size differs from the manifest's.
    SizeMismatch {
        /// The member.
        member: String,
        /// Size in the manifest.
        manifest: u64,
        /// Actual size.
        actual: u64,
    },
    /// Digest differs from the manifest's.
    DigestMismatch {
        /// The member.
        member: String,
        /// Digest in the manifest.
        manifest: String,
        /// Actual digest.
        actual: String,
    },
    /// A tile image is invalid.
    Image {
        /// The member.
        member: String,
        /// What is wrong.
        error: ImageError,
    },
    /// The manifest's contents break a rule of the format.
    Invalid(String),
}

impl fmt::Display for PackageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PackageError::Io { path, error } => write!(f, "{path}: {error}"),
            PackageError::Compression(e) => write!(f, "corrupt or truncated zstd stream: {e}"),
            PackageError::TooLarge => write!(f, "the archive decompresses to more than {MAX_ARCHIVE_BYTES} bytes"),
            PackageError::Archive(e) => write!(f, "corrupt tar archive: {e}"),
            PackageError::ManifestNotFirst { found: None } => write!(f, "the archive is empty (expected {MANIFEST} first)"),
            PackageError::ManifestNotFirst { found: Some(name) } => {
                write!(f, "the first member is `{name}`, expected {MANIFEST}")
            }
            PackageError::ManifestJson(e) => write!(f, "{MANIFEST}: {e}"),
            PackageError::UnsupportedFormatVersion(v) => write!(
                f,
                "{MANIFEST}: unsupported package format version {v} (this reader supports {FORMAT_VERSION})"
            ),
            PackageError::UnsupportedTarget(t) => write!(f, "{MANIFEST}: unsupported target `{t}` (expected {TARGET})"),
            PackageError::BadMember { member, reason } => write!(f, "member `{member}`: {reason}"),
            PackageError::DuplicateMember(m) => write!(f, "member `{m}` appears twice"),
            PackageError::UnlistedMember(m) => write!(f, "member `{m}` is not listed in {MANIFEST}"),
            PackageError::MissingMember(m) => write!(f, "member `{m}` is listed in {MANIFEST} but absent"),
            PackageError::SizeMismatch { member, manifest, actual } => {
                write!(f, "member `{member}`: size {actual} differs from the manifest's {manifest}")
            }
            PackageError::DigestMismatch { member, manifest, actual } => {
                write!(f, "member `{member}`: blake3 {actual} differs from the manifest's {manifest}")
            }
            PackageError::Image { member, error } => write!(f, "member `{member}`: {error}"),
            PackageError::Invalid(why) => write!(f, "{MANIFEST}: {why}"),
        }
    }
}

impl std::error::Error for PackageError {}

fn digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Why `name` cannot be an extra member's name, if it cannot.
fn member_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.len() > 100 {
        Some("names must be 1 to 100 bytes long")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
    {
        Some("names may contain only ASCII letters, digits, '.', '_', '-' and '/'")
    } else if name.starts_with('/')
        || name.ends_with('/')
        || name
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
    {
        Some("names must be relative paths without empty, '.' or '..' components")
    } else if name == MANIFEST || name == MANIFEST_DIGEST || name.starts_with("tiles/") {
        Some("manifest.json, manifest.json.blake3 and tiles/ are reserved for the manifest and tile images")
    } else {
        None
    }
}

fn invalid(why: String) -> PackageError {
    PackageError::Invalid(why)
}

/// Checks the manifest's descriptive part against the format's rules.
fn validate_info(info: &PackageInfo) -> Result<(), PackageError> {
    if info.tile_count == 0 || info.tile_count > TILES_PER_CHIP {
        return Err(invalid(format!(
            "tile_count {} is outside 1..={TILES_PER_CHIP}",
            info.tile_count
        )));
    }
    let mut call_names = BTreeSet::new();
    for call in &info.calls {
        if call.name.is_empty() || !call_names.insert(call.name.as_str()) {
            return Err(invalid(format!(
                "call name `{}` is empty or repeated",
                call.name
            )));
        }
        for (direction, tensors) in [("input", &call.inputs), ("output", &call.outputs)] {
            let mut names = BTreeSet::new();
            for t in tensors {
                let at = format!("call `{}` {direction} `{}`", call.name, t.name);
                if t.name.is_empty() || !names.insert(t.name.as_str()) {
                    return Err(invalid(format!("{at}: the name is empty or repeated")));
                }
                validate_tensor(info, t, direction == "output")
                    .map_err(|why| invalid(format!("{at}: {why}")))?;
                if direction == "output" && t.stop != 0 {
                    return Err(invalid(format!(
                        "{at}: an output has host stop {} (outputs are read after the call)",
                        t.stop
                    )));
                }
                if t.stop > call.host_stops {
                    return Err(invalid(format!(
                        "{at}: host stop {} of a call with {} host stops",
                        t.stop, call.host_stops
                    )));
                }
            }
        }
    }
    let command = info.host.command_address;
    if !command.is_multiple_of(4) || command < SRAM_BASE || command as u64 + 4 > SRAM_END as u64 {
        return Err(invalid(format!(
            "host command address 0x{command:X} is not a 4-aligned word inside tile SRAM \
             (0x{:X}..0x{:X})",
            SRAM_BASE, SRAM_END
        )));
    }
    for (i, w) in info.config_writes.iter().enumerate() {
        if w.register.is_empty() {
            return Err(invalid(format!(
                "config write {i} has an empty register name"
            )));
        }
        if let Some(tile) = w.tile {
            if tile >= info.tile_count {
                return Err(invalid(format!(
                    "config write {i} ({}) targets tile {tile}, beyond tile_count {}",
                    w.register, info.tile_count
                )));
            }
        }
    }
    Ok(())
}

fn validate_tensor(info: &PackageInfo, t: &StreamTensor, exactly_once: bool) -> Result<(), String> {
    if t.shape.contains(&0) {
        return Err(format!("shape {:?} has a zero dimension", t.shape));
    }
    if t.transposed && t.shape.len() < 2 {
        return Err(format!(
            "shape {:?} is transposed but has fewer than two dimensions",
            t.shape
        ));
    }
    let total = t
        .shape
        .iter()
        .try_fold(t.dtype.size_bytes() as u64, |acc, &d| {
            acc.checked_mul(d as u64)
        })
        .ok_or_else(|| format!("shape {:?} overflows", t.shape))?;
    let mut ranges = Vec::with_capacity(t.placements.len());
    for (i, p) in t.placements.iter().enumerate() {
        if p.tile >= info.tile_count {
            return Err(format!(
                "placement {i} is on tile {}, beyond tile_count {}",
                p.tile, info.tile_count
            ));
        }
        let end = p
            .offset
            .checked_add(p.bytes as u64)
            .filter(|&e| p.bytes > 0 && e <= total);
        let end = end.ok_or_else(|| {
            format!(
                "placement {i} covers bytes {}..+{} of a {total}-byte tensor (must be non-empty and inside it)",
                p.offset, p.bytes
            )
        })?;
        if p.address < SRAM_BASE || p.address as u64 + p.bytes as u64 > SRAM_END as u64 {
            return Err(format!(
                "placement {i} on tile {} at {:#07x}..+{} lies outside tile SRAM {SRAM_BASE:#07x}..{SRAM_END:#07x}",
                p.tile, p.address, p.bytes
            ));
        }
        ranges.push((p.offset, end));
    }
    ranges.sort_unstable();
    let mut covered = 0u64;
    for &(start, end) in &ranges {
        if start > covered {
            return Err(format!("bytes {covered}..{start} are placed on no tile"));
        }
        if exactly_once && start < covered {
            return Err(format!(
                "bytes {start}..{} are placed more than once (an output's bytes must come from one tile)",
                covered.min(end)
            ));
        }
        covered = covered.max(end);
    }
    if covered < total {
        return Err(format!("bytes {covered}..{total} are placed on no tile"));
    }
    Ok(())
}

/// One archive entry: its name and bytes (a member borrowed from the
/// package, or an encoded image or the manifest owned).
type TarEntry<'a> = (String, std::borrow::Cow<'a, [u8]>);

impl Package {
    /// The manifest, with member sizes and digests computed from the contents.
    pub fn manifest(&self) -> Result<Manifest, PackageError> {
        Ok(self.manifest_of(&self.encoded_images()?))
    }

    /// Every tile image encoded, (tile, bytes) in tile order.
    fn encoded_images(&self) -> Result<Vec<(u32, Vec<u8>)>, PackageError> {
        self.tiles
            .iter()
            .map(|(&tile, image)| {
                let bytes = image.encode().map_err(|error| PackageError::Image {
                    member: tile_file(tile),
                    error,
                })?;
                Ok((tile, bytes))
            })
            .collect()
    }

    /// The manifest of this package whose tile images encode to `images`
    /// (tile, bytes), in tile order.
    fn manifest_of(&self, images: &[(u32, Vec<u8>)]) -> Manifest {
        let tiles = images
            .iter()
            .map(|(tile, bytes)| TileEntry {
                tile: *tile,
                file: tile_file(*tile),
                size: bytes.len() as u64,
                blake3: digest(bytes),
            })
            .collect();
        Manifest {
            format_version: FORMAT_VERSION,
            compiler_version: self.info.compiler_version.clone(),
            target: TARGET.to_string(),
            tile_count: self.info.tile_count,
            model: self.info.model.clone(),
            host: self.info.host,
            calls: self.info.calls.clone(),
            config_writes: self.info.config_writes.clone(),
            report_summary: self.info.report_summary.clone(),
            tiles,
            members: self
                .members
                .iter()
                .map(|(name, bytes)| MemberEntry {
                    name: name.clone(),
                    size: bytes.len() as u64,
                    blake3: digest(bytes),
                })
                .collect(),
        }
    }

    /// Checks every rule a reader checks.
    pub fn validate(&self) -> Result<(), PackageError> {
        validate_info(&self.info)?;
        for (&tile, image) in &self.tiles {
            let member = tile_file(tile);
            if tile >= self.info.tile_count {
                return Err(invalid(format!(
                    "{member}: tile {tile} is beyond tile_count {}",
                    self.info.tile_count
                )));
            }
            if image.tile != tile {
                return Err(invalid(format!(
                    "{member} holds the image of tile {}, not tile {tile}",
                    image.tile
                )));
            }
            image
                .validate()
                .map_err(|error| PackageError::Image { member, error })?;
        }
        for name in self.members.keys() {
            if let Some(reason) = member_name_problem(name) {
                return Err(PackageError::BadMember {
                    member: name.clone(),
                    reason: reason.to_string(),
                });
            }
        }
        Ok(())
    }

    /// The archive's entries in order, each tile image encoded once: the
    /// manifest, its digest, then the members and tile files by name.
    fn tar_entries(&self) -> Result<Vec<TarEntry<'_>>, PackageError> {
        use std::borrow::Cow;
        self.validate()?;
        let images = self.encoded_images()?;
        let manifest = self.manifest_of(&images);
        let mut json = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| PackageError::ManifestJson(e.to_string()))?;
        json.push(b'\n');
        let manifest_digest = format!("{}\n", digest(&json)).into_bytes();
        let mut files: BTreeMap<String, Cow<'_, [u8]>> = self
            .members
            .iter()
            .map(|(name, bytes)| (name.clone(), Cow::Borrowed(bytes.as_slice())))
            .collect();
        for (tile, bytes) in images {
            files.insert(tile_file(tile), Cow::Owned(bytes));
        }
        let mut entries = vec![
            (MANIFEST.to_string(), Cow::Owned(json)),
            (MANIFEST_DIGEST.to_string(), Cow::Owned(manifest_digest)),
        ];
        entries.extend(files);
        Ok(entries)
    }

    /// Writes `entries` as a ustar archive to `out` (every header fixed, so
    /// the archive depends on the entries alone).
    fn write_tar<W: Write>(entries: &[TarEntry<'_>], out: W) -> Result<W, PackageError> {
        let mut builder = tar::Builder::new(out);
        let archive_error = |e: std::io::Error| PackageError::Archive(e.to_string());
        for (name, bytes) in entries {
            let mut header = tar::Header::new_ustar();
            header.set_path(name).map_err(archive_error)?;
            header.set_size(bytes.len() as u64);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(0o644);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            header.set_username("").map_err(archive_error)?;
            header.set_groupname("").map_err(archive_error)?;
            header.set_cksum();
            builder.append(&header, &**bytes).map_err(archive_error)?;
        }
        builder.into_inner().map_err(archive_error)
    }

    /// The size of the archive [`Package::write_tar`] writes: a 512-byte
    /// header and the data padded to 512 bytes per entry (the names are
    /// short enough for one ustar header), then two zero blocks.
    fn tar_size(entries: &[TarEntry<'_>]) -> u64 {
        entries
            .iter()
            .map(|(_, b)| 512 + (b.len() as u64).div_ceil(512) * 512)
            .sum::<u64>()
            + 1024
    }

    /// The uncompressed tar archive.
    pub fn to_tar(&self) -> Result<Vec<u8>, PackageError> {
        let entries = self.tar_entries()?;
        Package::write_tar(&entries, Vec::new())
    }

    /// The package file's bytes: the tar archive compressed with zstd at
    /// [`ZSTD_LEVEL`], with the frame's content checksum enabled. The
    /// archive streams into the compressor (the 27-layer encoder's is
    /// 233 MB) with its size pledged in advance, which zstd checks.
    pub fn to_bytes(&self) -> Result<Vec<u8>, PackageError> {
        let entries = self.tar_entries()?;
        let compression = |e: std::io::Error| PackageError::Compression(e.to_string());
        let mut encoder =
            zstd::stream::Encoder::new(Vec::new(), ZSTD_LEVEL).map_err(compression)?;
        encoder.include_checksum(true).map_err(compression)?;
        encoder.include_contentsize(true).map_err(compression)?;
        encoder
            .set_pledged_src_size(Some(Package::tar_size(&entries)))
            .map_err(compression)?;
        let encoder = Package::write_tar(&entries, encoder)?;
        encoder.finish().map_err(compression)
    }

    /// Writes the package to `path` atomically: a temporary file in the same
    /// directory is written, flushed to disk and renamed over `path`.
    pub fn write(&self, path: &Path) -> Result<(), PackageError> {
        let bytes = self.to_bytes()?;
        let io = |e: std::io::Error| PackageError::Io {
            path: path.display().to_string(),
            error: e,
        };
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut tmp = tempfile::Builder::new()
            .prefix(".ipupkg-")
            .tempfile_in(dir)
            .map_err(io)?;
        tmp.write_all(&bytes).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        tmp.persist(path).map_err(|e| io(e.error))?;
        Ok(())
    }

    /// Reads and validates a package file.
    pub fn read(path: &Path) -> Result<Package, PackageError> {
        let bytes = std::fs::read(path).map_err(|e| PackageError::Io {
            path: path.display().to_string(),
            error: e,
        })?;
        Package::from_bytes(&bytes)
    }

    /// Decompresses and validates a package.
    pub fn from_bytes(bytes: &[u8]) -> Result<Package, PackageError> {
        let decoder = zstd::stream::Decoder::new(bytes)
            .map_err(|e| PackageError::Compression(e.to_string()))?;
        let mut tar = Vec::new();
        decoder
            .take(MAX_ARCHIVE_BYTES + 1)
            .read_to_end(&mut tar)
            .map_err(|e| PackageError::Compression(e.to_string()))?;
        if tar.len() as u64 > MAX_ARCHIVE_BYTES {
            return Err(PackageError::TooLarge);
        }
        Package::from_tar(&tar)
    }

    /// Validates an uncompressed package archive.
    pub fn from_tar(tar: &[u8]) -> Result<Package, PackageError> {
        let archive_error = |e: std::io::Error| PackageError::Archive(e.to_string());
        let mut archive = tar::Archive::new(tar);
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        for entry in archive.entries().map_err(archive_error)? {
            let mut entry = entry.map_err(archive_error)?;
            let name = match entry.path() {
                Ok(p) => p.to_string_lossy().into_owned(),
                Err(e) => {
                    return Err(PackageError::Archive(format!(
                        "member {}: {e}",
                        files.len()
                    )))
                }
            };
            if entry.header().entry_type() != tar::EntryType::Regular {
                return Err(PackageError::BadMember {
                    member: name,
                    reason: format!(
                        "is a {:?} entry, not a regular file",
                        entry.header().entry_type()
                    ),
                });
            }
            let size = entry.size();
            if size > tar.len() as u64 {
                return Err(PackageError::Archive(format!(
                    "member `{name}` claims {size} bytes, more than the archive holds"
                )));
            }
            let mut data = Vec::with_capacity(size as usize);
            entry
                .read_to_end(&mut data)
                .map_err(|e| PackageError::Archive(format!("member `{name}`: {e}")))?;
            if data.len() as u64 != size {
                return Err(PackageError::Archive(format!(
                    "member `{name}` is truncated"
                )));
            }
            files.push((name, data));
        }
        let mut files = files.into_iter();
        let manifest_bytes = match files.next() {
            Some((name, data)) if name == MANIFEST => data,
            other => {
                return Err(PackageError::ManifestNotFirst {
                    found: other.map(|f| f.0),
                })
            }
        };
        let actual = digest(&manifest_bytes);
        match files.next() {
            Some((name, data)) if name == MANIFEST_DIGEST => {
                if data != format!("{actual}\n").as_bytes() {
                    return Err(PackageError::BadMember {
                        member: MANIFEST.to_string(),
                        reason: format!(
                            "its blake3 {actual} differs from the digest recorded in {MANIFEST_DIGEST}, {}",
                            String::from_utf8_lossy(&data).trim_end()
                        ),
                    });
                }
            }
            other => {
                return Err(PackageError::BadMember {
                    member: other.map_or_else(|| "(end of archive)".to_string(), |f| f.0),
                    reason: format!("expected {MANIFEST_DIGEST} right after {MANIFEST}"),
                })
            }
        }
        let manifest: Manifest = serde_json::from_slice(&manifest_bytes)
            .map_err(|e| PackageError::ManifestJson(e.to_string()))?;
        if manifest.format_version != FORMAT_VERSION {
            return Err(PackageError::UnsupportedFormatVersion(
                manifest.format_version,
            ));
        }
        if manifest.target != TARGET {
            return Err(PackageError::UnsupportedTarget(manifest.target));
        }
        let info = PackageInfo {
            compiler_version: manifest.compiler_version.clone(),
            tile_count: manifest.tile_count,
            model: manifest.model.clone(),
            host: manifest.host,
            calls: manifest.calls.clone(),
            config_writes: manifest.config_writes.clone(),
            report_summary: manifest.report_summary.clone(),
        };
        validate_info(&info)?;

        // What the manifest promises, by member name: (size, digest, tile).
        let mut listed: BTreeMap<String, (u64, String, Option<u32>)> = BTreeMap::new();
        let mut previous_tile = None;
        for t in &manifest.tiles {
            if t.file != tile_file(t.tile) {
                return Err(invalid(format!(
                    "tile {} is stored as `{}`, expected `{}`",
                    t.tile,
                    t.file,
                    tile_file(t.tile)
                )));
            }
            if t.tile >= manifest.tile_count {
                return Err(invalid(format!(
                    "{}: tile {} is beyond tile_count {}",
                    t.file, t.tile, manifest.tile_count
                )));
            }
            if previous_tile.is_some_and(|p| p >= t.tile) {
                return Err(invalid(format!(
                    "tiles must be listed once each in increasing order; {} is out of order",
                    t.file
                )));
            }
            previous_tile = Some(t.tile);
            listed.insert(t.file.clone(), (t.size, t.blake3.clone(), Some(t.tile)));
        }
        let mut previous_member: Option<&str> = None;
        for m in &manifest.members {
            if let Some(reason) = member_name_problem(&m.name) {
                return Err(PackageError::BadMember {
                    member: m.name.clone(),
                    reason: reason.to_string(),
                });
            }
            if previous_member.is_some_and(|p| p >= m.name.as_str()) {
                return Err(invalid(format!(
                    "members must be listed once each in sorted order; `{}` is out of order",
                    m.name
                )));
            }
            previous_member = Some(&m.name);
            listed.insert(m.name.clone(), (m.size, m.blake3.clone(), None));
        }

        let mut tiles = BTreeMap::new();
        let mut members = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for (name, data) in files {
            if name == MANIFEST || name == MANIFEST_DIGEST || !seen.insert(name.clone()) {
                return Err(PackageError::DuplicateMember(name));
            }
            let (size, blake3, tile) = listed
                .get(&name)
                .cloned()
                .ok_or_else(|| PackageError::UnlistedMember(name.clone()))?;
            if data.len() as u64 != size {
                return Err(PackageError::SizeMismatch {
                    member: name,
                    manifest: size,
                    actual: data.len() as u64,
                });
            }
            let actual = digest(&data);
            if actual != blake3 {
                return Err(PackageError::DigestMismatch {
                    member: name,
                    manifest: blake3,
                    actual,
                });
            }
            match tile {
                Some(tile) => {
                    let image = TileImage::decode(&data).map_err(|error| PackageError::Image {
                        member: name.clone(),
                        error,
                    })?;
                    if image.tile != tile {
                        return Err(invalid(format!(
                            "{name} holds the image of tile {}, not tile {tile}",
                            image.tile
                        )));
                    }
                    tiles.insert(tile, image);
                }
                None => {
                    members.insert(name, data);
                }
            }
        }
        if let Some(missing) = listed.keys().find(|k| !seen.contains(*k)) {
            return Err(PackageError::MissingMember(missing.clone()));
        }
        Ok(Package {
            info,
            tiles,
            members,
        })
    }
}
