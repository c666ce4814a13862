//! Writes the seed corpus of the fuzz targets from the repository's real
//! inputs, or replays inputs through a target's checks on the stable
//! toolchain.
//!
//! ```text
//! fuzz-seeds ROOT OUT          write OUT/<target>/<seed> from the repo at ROOT
//! fuzz-seeds --replay TARGET FILE...
//! ```
//!
//! Seeds: the assembler filetests and every `device/*.S` for `assembler`;
//! the objects, metadata, linked images and code bytes of those that
//! assemble for `object_reader`; the archive, manifest and tile images of
//! the sample package for `package_reader`. Names are content digests, so
//! rewriting the corpus is idempotent.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ipu_fuzz_support::*;

fn sources(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "S"))
        .collect();
    out.sort();
    Ok(out)
}

fn write_seed(out: &Path, target: &str, bytes: &[u8]) -> Result<(), String> {
    let dir = out.join(target);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let name = blake3::hash(bytes).to_hex()[..16].to_string();
    let path = dir.join(name);
    std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn write_seeds(root: &Path, out: &Path) -> Result<(), String> {
    let mut files = sources(&root.join("rust/ipu-asm/tests/filetests"))?;
    files.extend(sources(&root.join("device"))?);
    if files.is_empty() {
        return Err(format!("{}: no assembly sources found", root.display()));
    }
    let (mut asm_seeds, mut obj_seeds) = (0, 0);
    for path in &files {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        write_seed(out, "assembler", &bytes)?;
        asm_seeds += 1;
        let input = asm_input(&bytes);
        let Ok(a) = ipu_asm::assemble_source_in_memory(
            "seed.S",
            &input.main,
            &input.includes,
            &input.options,
        ) else {
            continue;
        };
        let object = a
            .object
            .to_bytes()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        write_seed(out, "object_reader", &object)?;
        write_seed(out, "object_reader", a.metadata.to_json().as_bytes())?;
        obj_seeds += 2;
        if let Some(code) = a.object.section(".text") {
            write_seed(out, "object_reader", &code.bytes)?;
            obj_seeds += 1;
        }
        if let Some(entry) = a.metadata.entries.first() {
            let inputs = [ipu_link::Input {
                name: "seed.o".to_string(),
                object: a.object.clone(),
            }];
            if let Ok(linked) = ipu_link::link(&inputs, &ipu_link::LinkOptions::new(entry)) {
                let image = linked
                    .image
                    .to_bytes()
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                write_seed(out, "object_reader", &image)?;
                obj_seeds += 1;
            }
        }
    }
    let package = sample_package();
    let tar = package.to_tar().map_err(|e| e.to_string())?;
    let members = archive_members(&tar);
    let with_mode = |mode: u8, bytes: &[u8]| {
        let mut v = vec![mode];
        v.extend_from_slice(bytes);
        v
    };
    write_seed(out, "package_reader", &with_mode(0, &tar))?;
    write_seed(out, "package_reader", &with_mode(1, &members[0].1))?;
    let mut pkg_seeds = 2;
    for image in package.tiles.values() {
        let bytes = image.encode().map_err(|e| e.to_string())?;
        write_seed(out, "package_reader", &with_mode(2, &bytes))?;
        pkg_seeds += 1;
    }
    println!(
        "seeds: assembler {asm_seeds}, object_reader {obj_seeds}, package_reader {pkg_seeds} -> {}",
        out.display()
    );
    Ok(())
}

fn replay(target: &str, files: &[String]) -> Result<(), String> {
    let check: fn(&[u8]) = match target {
        "assembler" => check_assembler,
        "object_reader" => check_object_reader,
        "package_reader" => check_package_reader,
        other => return Err(format!("unknown target `{other}`")),
    };
    for f in files {
        let bytes = std::fs::read(f).map_err(|e| format!("{f}: {e}"))?;
        check(&bytes);
        println!("{f}: ok");
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [flag, target, files @ ..] if flag == "--replay" => replay(target, files),
        [root, out] => write_seeds(Path::new(root), Path::new(out)),
        _ => Err("usage: fuzz-seeds ROOT OUT | fuzz-seeds --replay TARGET FILE...".to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fuzz-seeds: {e}");
            ExitCode::FAILURE
        }
    }
}
