//! `ipu-ld OBJ... -o tile.img --entry SYM [--base 0x4C000] [--data-base ADDR]
//! [--interleaved-base ADDR] [--map FILE] [--keep SYM]... [--no-gc-sections]`
//!
//! Quiet on success; errors go to stderr and exit 1. Outputs are written atomically.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

fn address(text: &str) -> Result<u32, String> {
    ipu_isa::parse_int(text)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| format!("`{text}` is not a 32-bit address"))
}

#[derive(Parser)]
#[command(
    name = "ipu-ld",
    version,
    about = "Link ipu21 objects into a tile image"
)]
struct Args {
    /// Input objects.
    #[arg(required = true)]
    objects: Vec<PathBuf>,
    /// Output tile image.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Entry symbol.
    #[arg(long)]
    entry: String,
    /// Code start address (region 0).
    #[arg(long, value_parser = address, default_value = "0x4C000")]
    base: u32,
    /// Start address of unconstrained data (default: after code).
    #[arg(long, value_parser = address)]
    data_base: Option<u32>,
    /// Start address of interleaved (region 1) sections.
    #[arg(long, value_parser = address, default_value = "0x80000")]
    interleaved_base: u32,
    /// Write a map file.
    #[arg(long)]
    map: Option<PathBuf>,
    /// Keep the section of this symbol even if unreferenced.
    #[arg(long)]
    keep: Vec<String>,
    /// Keep every section.
    #[arg(long)]
    no_gc_sections: bool,
}

fn run(args: Args) -> Result<(), String> {
    let mut inputs = Vec::new();
    for p in &args.objects {
        let bytes = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let object =
            ipu_object::Object::from_bytes(&bytes).map_err(|e| format!("{}: {e}", p.display()))?;
        inputs.push(ipu_link::Input {
            name: p.display().to_string(),
            object,
        });
    }
    let opts = ipu_link::LinkOptions {
        entry: args.entry,
        keep: args.keep,
        base: args.base,
        data_base: args.data_base,
        interleaved_base: args.interleaved_base,
        gc_sections: !args.no_gc_sections,
    };
    let linked = ipu_link::link(&inputs, &opts).map_err(|e| e.to_string())?;
    let bytes = linked.image.to_bytes().map_err(|e| e.to_string())?;
    ipu_object::write_atomic(&args.output, &bytes)
        .map_err(|e| format!("{}: {e}", args.output.display()))?;
    if let Some(m) = &args.map {
        ipu_object::write_atomic(m, linked.map().as_bytes())
            .map_err(|e| format!("{}: {e}", m.display()))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipu-ld: {e}");
            ExitCode::FAILURE
        }
    }
}
