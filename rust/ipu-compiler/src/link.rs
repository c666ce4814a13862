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
    link(&inputs, &LinkOptions::new(crate::emit::ENTRY)).map_err(|e| match e {
        // Code and vertex states alone beyond region 0 (a program of very
        // many steps): a memory limit like any other, which `compile`
        // answers with its region-0 retries, not a code generation fault.
        ipu_link::LinkError::RegionOverflow {
            area,
            needed,
            available,
            largest,
        } if area.starts_with("region 0") => CompileError::OutOfMemory {
            tile,
            region: "region 0 (standard)",
            needed,
            available,
            largest: largest
                .into_iter()
                .map(|(section, bytes)| (format!("code: {section}"), bytes as u64))
                .collect(),
        },
        e => CompileError::CodeGen {
            tile,
            message: e.to_string(),
        },
    })
}

/// The program text with its comment lines dropped and every numeric
/// literal of a `.word` line written as `0`: a `.word` value does not
/// change the size of what it assembles to, so two programs with the same
/// shape assemble and link to the same sizes (the generated programs,
/// docs/runtime.md, hold their tile-specific numbers in `.word` lines).
/// Other lines are kept as they are, so a directive whose number sets a
/// size (`.align`, `.space`) keeps it. A digit inside a symbol
/// (`vs_1_4_0`) is part of the symbol, not a literal.
pub fn program_shape(program: &str) -> String {
    let mut out = String::with_capacity(program.len());
    for line in program.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        if !line.contains(".word") {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let bytes = line.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let c = bytes[i];
            let in_symbol = i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
            if c.is_ascii_digit() && !in_symbol {
                while i < bytes.len() && (bytes[i].is_ascii_hexdigit() || bytes[i] == b'x') {
                    i += 1;
                }
                out.push('0');
            } else {
                out.push(c as char);
                i += 1;
            }
        }
        out.push('\n');
    }
    out
}

/// Code sizes of dry-run links (every buffer at address 0), by program
/// shape and kernel set: `place_storage` needs each tile's code size before
/// it can place buffers, and most of a chip's tiles run programs of a few
/// shapes, so one link per shape serves them all. The final link checks
/// that the code ends where this size said ([`tile_image`]).
#[derive(Default)]
pub struct CodeSizes {
    sizes: std::sync::Mutex<std::collections::HashMap<(String, Vec<String>), u32>>,
}

impl CodeSizes {
    /// Bytes of code and data from `REGION0_BASE` that `program` linked
    /// with `kernels` occupies on `tile`.
    pub fn get(
        &self,
        tile: u32,
        program: &str,
        kernels: &[&LoadedKernel],
    ) -> Result<u32, CompileError> {
        let key = (
            program_shape(program),
            kernels.iter().map(|k| k.origin.clone()).collect(),
        );
        if let Some(&bytes) = self.sizes.lock().expect("not poisoned").get(&key) {
            return Ok(bytes);
        }
        let linked = link_program(tile, program, kernels)?;
        let bytes = linked_end(&linked) - ipu_arch::REGION0_BASE;
        self.sizes.lock().expect("not poisoned").insert(key, bytes);
        Ok(bytes)
    }
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
    let mut segments = linked.image.segments.clone();
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
        // Contents are written once, at load: a buffer that shares its
        // memory with others of another segment or phase would lose them.
        if buffers[buffer].lifetime.is_some() || buffers[buffer].scratch.is_some() {
            return Err(CompileError::Verifier {
                phase: "link",
                message: format!(
                    "tile {tile}: buffer `{}` starts with contents but lives only in part of the run",
                    buffers[buffer].name
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

#[cfg(test)]
mod shape_tests {
    use super::program_shape;

    #[test]
    fn program_shapes_ignore_values_and_comments_but_keep_symbols() {
        let a = "# tile 3\nvs_1_4_0: .word 0x900, 12, gemm_f16__ACC16\n        .align 4\n";
        let b = "# tile 700\nvs_1_4_0: .word 0x1f50, 7, gemm_f16__ACC16\n        .align 4\n";
        assert_eq!(program_shape(a), program_shape(b));
        assert_eq!(
            program_shape(a),
            "vs_1_4_0: .word 0, 0, gemm_f16__ACC16\n        .align 4\n"
        );
        // One word more, or another symbol, is another shape.
        let c = "vs_1_4_0: .word 0x900, 12, 5, gemm_f16__ACC16\n        .align 4\n";
        let d = "vs_1_4_1: .word 0x900, 12, gemm_f16__ACC16\n        .align 4\n";
        let e = "vs_1_4_0: .word 0x900, 12, gemm_f16__ACC16\n        .align 8\n";
        assert_ne!(program_shape(a), program_shape(c));
        assert_ne!(program_shape(a), program_shape(d));
        // A number that sets a size is part of the shape.
        assert_ne!(program_shape(a), program_shape(e));
    }
}
