//! Phase `link`: the tile program (assembled by `ipu-asm`) plus the kernel
//! objects its vertices call, linked by `ipu-link` into the tile's image, plus
//! the zero-initialised ranges of its buffers.

use crate::error::CompileError;
use crate::library::LoadedKernel;
use crate::lower::BufferSpec;
use crate::storage::TileStorage;
use ipu_link::{link, Input, LinkOptions};
use ipu_object::SymbolKind;
use std::path::Path;

/// A linked tile.
pub struct LinkedTile {
    pub image: ipu_package::TileImage,
    /// End of the linked code and data (region 0).
    pub code_end: u32,
    /// Code and data symbols: (name, address, size).
    pub symbols: Vec<(String, u32, u32)>,
}

/// Assembles `program` and links it with `kernels`.
pub fn link_program(
    tile: u32,
    program: &str,
    kernels: &[&LoadedKernel],
) -> Result<ipu_link::Linked, CompileError> {
    let name = format!("tile{tile:04}.S");
    let asm =
        ipu_asm::assemble_source(&name, program, Path::new("."), &ipu_asm::Options::default())
            .map_err(|e| CompileError::CodeGen {
                tile,
                message: format!("{e}"),
            })?;
    let mut inputs = vec![Input {
        name: format!("tile{tile:04}.o"),
        object: asm.object,
    }];
    for k in kernels {
        inputs.push(Input {
            name: k.origin.clone(),
            object: k.object.clone(),
        });
    }
    link(&inputs, &LinkOptions::new(crate::emit::ENTRY)).map_err(|e| CompileError::CodeGen {
        tile,
        message: e.to_string(),
    })
}

/// End address of everything a link placed.
pub fn linked_end(linked: &ipu_link::Linked) -> u32 {
    linked
        .image
        .segments
        .iter()
        .map(|s| s.address + s.bytes.len() as u32)
        .max()
        .unwrap_or(ipu_arch::REGION0_BASE)
}

/// The package image of a tile: the linked segments, a zero segment for
/// every buffer range that must start zeroed, and `contents` (buffer index,
/// bytes) for buffers that start with data (the exchange tables).
pub fn tile_image(
    tile: u32,
    linked: &ipu_link::Linked,
    buffers: &[BufferSpec],
    storage: &TileStorage,
    contents: Vec<(usize, Vec<u8>)>,
) -> Result<LinkedTile, CompileError> {
    let code_end = linked_end(linked);
    if code_end > storage.code_end {
        return Err(CompileError::Verifier {
            phase: "link",
            message: format!(
                "tile {tile}: linked code ends at {code_end:#x}, beyond the {:#x} that place_storage reserved",
                storage.code_end
            ),
        });
    }
    let mut segments: Vec<ipu_package::Segment> = linked
        .image
        .segments
        .iter()
        .map(|s| ipu_package::Segment {
            address: s.address,
            bytes: s.bytes.clone(),
        })
        .collect();
    for (b, &addr) in buffers.iter().zip(&storage.addresses) {
        for &(start, end) in &b.zero {
            segments.push(ipu_package::Segment {
                address: addr + start,
                bytes: vec![0; (end - start) as usize],
            });
        }
    }
    // Buffers with initial contents (the exchange tables).
    for (buffer, bytes) in contents {
        if bytes.len() as u64 > buffers[buffer].bytes as u64 {
            return Err(CompileError::Verifier {
                phase: "link",
                message: format!(
                    "tile {tile}: {} bytes of contents for buffer `{}` of {} bytes",
                    bytes.len(),
                    buffers[buffer].name,
                    buffers[buffer].bytes
                ),
            });
        }
        if !bytes.is_empty() {
            segments.push(ipu_package::Segment {
                address: storage.addresses[buffer],
                bytes,
            });
        }
    }
    segments.sort_by_key(|s| s.address);
    let image = ipu_package::TileImage {
        tile,
        entry_pc: linked.image.entry,
        segments,
    };
    image.validate().map_err(|e| CompileError::Verifier {
        phase: "link",
        message: format!("tile {tile}: {e}"),
    })?;
    let symbols = linked
        .image
        .symbols
        .iter()
        .filter(|(_, s)| s.kind != SymbolKind::NoType)
        .map(|(n, s)| (n.clone(), s.address, s.size))
        .collect();
    Ok(LinkedTile {
        image,
        code_end,
        symbols,
    })
}
