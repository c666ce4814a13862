//! `ipu object inspect FILE`: a listing of a relocatable object or a tile image.

use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum ObjectCommand {
    /// Disassemble and list sections, symbols and relocations of a kernel.o, or
    /// the segments, symbols and code of a tile image from ipu-ld.
    Inspect {
        /// A kernel.o or a tile image.
        file: PathBuf,
    },
}

pub fn run(command: ObjectCommand) -> Result<(), String> {
    match command {
        ObjectCommand::Inspect { file } => {
            let bytes = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            if bytes.starts_with(&ipu_object::IMAGE_MAGIC) {
                let image = ipu_object::TileImage::from_bytes(&bytes)
                    .map_err(|e| format!("{}: {e}", file.display()))?;
                print!("{}", describe_image(&image));
            } else {
                let object = ipu_object::Object::from_bytes(&bytes)
                    .map_err(|e| format!("{}: {e}", file.display()))?;
                print!("{}", ipu_object::dump_object(&object));
            }
            Ok(())
        }
    }
}

fn describe_image(image: &ipu_object::TileImage) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tile image: entry 0x{:05X}, {} bytes loaded",
        image.entry,
        image.loaded_bytes()
    );
    for s in &image.segments {
        let _ = writeln!(
            out,
            "segment 0x{:05X}..0x{:05X} ({} bytes)",
            s.address,
            s.address as u64 + s.bytes.len() as u64,
            s.bytes.len()
        );
    }
    for (name, sym) in &image.symbols {
        let _ = writeln!(
            out,
            "symbol {name} = 0x{:05X} size {} {:?}",
            sym.address, sym.size, sym.kind
        );
    }
    for s in &image.segments {
        if ipu_arch::Region::of(s.address) == Some(ipu_arch::Region::Standard) {
            let _ = writeln!(out, "code/data at 0x{:05X}:", s.address);
            for line in ipu_isa::disassemble(&s.bytes, s.address) {
                let label = image
                    .symbolize(line.address)
                    .filter(|(_, offset)| *offset == 0)
                    .map(|(name, _)| format!("{name}:\n"))
                    .unwrap_or_default();
                let _ = writeln!(out, "{label}  {line}");
            }
        }
    }
    out
}
