//! `ipu-as SRC -o kernel.o [--metadata kernel.json] [-D K=V]... [-I DIR]... [--name NAME]`
//!
//! Quiet on success; errors go to stderr with file:line:column and exit 1.
//! Outputs are written atomically.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ipu-as",
    version,
    about = "Assemble ipu21 assembly into a relocatable object"
)]
struct Args {
    /// Assembly source (.S).
    src: PathBuf,
    /// Output object.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Write kernel metadata (JSON) here.
    #[arg(long)]
    metadata: Option<PathBuf>,
    /// Define a parameter: -D NAME=VALUE.
    #[arg(short = 'D', value_name = "NAME=VALUE")]
    defines: Vec<String>,
    /// Add an include directory.
    #[arg(short = 'I', value_name = "DIR")]
    include: Vec<PathBuf>,
    /// Kernel name recorded in the metadata.
    #[arg(long)]
    name: Option<String>,
    /// Target architecture; only ipu21 exists today.
    #[arg(long, default_value = "ipu21")]
    target: String,
    /// Print a listing of the object (disassembly, symbols, relocations) to stdout.
    #[arg(long)]
    dump: bool,
}

/// Architectures this assembler can target.
const SUPPORTED_TARGETS: &[&str] = &["ipu21"];

fn run(args: Args) -> Result<(), String> {
    if !SUPPORTED_TARGETS.contains(&args.target.as_str()) {
        return Err(format!(
            "unsupported --target {:?}: this assembler targets {}",
            args.target,
            SUPPORTED_TARGETS.join(", ")
        ));
    }
    let mut opts = ipu_asm::Options {
        include_dirs: args.include,
        name: args.name,
        target: args.target,
        ..Default::default()
    };
    for d in &args.defines {
        let (k, v) = ipu_asm::parse_define(d)?;
        if opts.defines.insert(k.clone(), v).is_some() {
            return Err(format!("-D {k} given twice"));
        }
    }
    let out = ipu_asm::assemble_file(&args.src, &opts).map_err(|e| e.to_string())?;
    let bytes = out.object.to_bytes().map_err(|e| e.to_string())?;
    ipu_object::write_atomic(&args.output, &bytes)
        .map_err(|e| format!("{}: cannot write: {e}", args.output.display()))?;
    if let Some(m) = &args.metadata {
        ipu_object::write_atomic(m, out.metadata.to_json().as_bytes())
            .map_err(|e| format!("{}: cannot write: {e}", m.display()))?;
    }
    if args.dump {
        print!("{}", ipu_object::dump_object(&out.object));
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipu-as: {e}");
            ExitCode::FAILURE
        }
    }
}
