//! The ipu21 assembler: assembly text (`.S`) to a relocatable [`Object`] and
//! its [`KernelMetadata`].
//!
//! Syntax and directives are documented in docs/assembler.md; instruction
//! syntax, encoding and operand parsing come from `ipu-isa` (this crate never
//! encodes an instruction itself). One source yields many specialisations:
//! parameters given in [`Options::defines`] (`-D K=64`) are constants visible
//! to every expression, `.if` and `.rept`.
//!
//! Invariants:
//! - Deterministic: the same sources and options give byte-identical objects
//!   and metadata.
//! - Every error names file:line:column and, through includes, macros and
//!   `.rept`, the chain of expansion sites. No input makes the assembler
//!   panic (fuzz-tested); runaway expansion is cut off with an error.
//! - Code sections hold only bundles: every word of a code section decodes,
//!   alignment pads with `nop`, and hardware-loop bodies contain no control
//!   instruction.
//! - Branches to labels of the same section are resolved here; every other
//!   symbol reference becomes a relocation for the linker.

mod asm;
mod error;
mod expr;
mod syntax;

pub use error::{AsmError, Frame, Loc};
pub use ipu_object::{KernelMetadata, Object};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Assembler options (the command line of `ipu-as`).
#[derive(Clone, Debug)]
pub struct Options {
    /// `-D NAME=VALUE` parameters.
    pub defines: BTreeMap<String, i64>,
    /// `-I DIR` include search directories, searched in order after the
    /// including file's own directory.
    pub include_dirs: Vec<PathBuf>,
    /// `--name`: the kernel name in the metadata.
    pub name: Option<String>,
    /// Target architecture recorded in the metadata.
    pub target: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            defines: BTreeMap::new(),
            include_dirs: Vec::new(),
            name: None,
            target: "ipu21".to_string(),
        }
    }
}

/// The result of one assembly.
#[derive(Clone, Debug)]
pub struct Assembly {
    pub object: Object,
    pub metadata: KernelMetadata,
    /// The main source and every included file, in the order read.
    pub files: Vec<PathBuf>,
}

/// Assembles the file at `path`.
pub fn assemble_file(path: &Path, opts: &Options) -> Result<Assembly, AsmError> {
    let display = path.display().to_string();
    let file_err = |m: String| AsmError {
        loc: Loc {
            file: Rc::from(display.as_str()),
            line: 0,
            col: 0,
        },
        message: m,
        context: vec![],
    };
    let bytes = std::fs::read(path).map_err(|e| file_err(format!("cannot read: {e}")))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| file_err(format!("not UTF-8 (byte {})", e.utf8_error().valid_up_to())))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut out = assemble_source(&display, &text, dir, opts)?;
    out.files[0] = path.to_path_buf();
    Ok(out)
}

/// Assembles `text` named `name` in messages; `.include` looks in `dir` first.
pub fn assemble_source(
    name: &str,
    text: &str,
    dir: &Path,
    opts: &Options,
) -> Result<Assembly, AsmError> {
    assemble_with(name, text, dir, None, opts)
}

/// Assembles `text` named `name` in messages with every `.include` served
/// from `includes` (keyed by the name exactly as written in the directive);
/// the file system is never read. Fuzzing and tests use this so that no
/// input can reach files outside the given map.
pub fn assemble_source_in_memory(
    name: &str,
    text: &str,
    includes: &BTreeMap<String, String>,
    opts: &Options,
) -> Result<Assembly, AsmError> {
    assemble_with(name, text, Path::new("."), Some(includes), opts)
}

fn assemble_with(
    name: &str,
    text: &str,
    dir: &Path,
    includes: Option<&BTreeMap<String, String>>,
    opts: &Options,
) -> Result<Assembly, AsmError> {
    let mut a = asm::Assembler::new(opts);
    a.memory_includes = includes;
    a.files
        .push((PathBuf::from(name), text.as_bytes().to_vec()));
    let lines = asm::split_lines(text, Rc::from(name), Rc::from(dir), Rc::new(Vec::new()));
    a.run(&lines)?;
    a.finish(name)
}

/// Parses a `NAME=VALUE` command-line definition (VALUE an integer literal).
pub fn parse_define(text: &str) -> Result<(String, i64), String> {
    let (n, v) = text
        .split_once('=')
        .ok_or_else(|| format!("-D {text}: expected NAME=VALUE"))?;
    let n = n.trim();
    if !syntax::is_identifier(n) {
        return Err(format!("-D {text}: `{n}` is not a valid name"));
    }
    let v = ipu_isa::parse_int(v.trim())
        .ok_or_else(|| format!("-D {text}: `{}` is not an integer", v.trim()))?;
    Ok((n.to_string(), v))
}

/// The source digest recorded in the metadata: blake3 over the main source
/// and every included file's bytes, in the order read, each prefixed with its
/// length. The kernel cache recomputes it to key entries.
pub fn source_digest(files: &[&[u8]]) -> String {
    let mut hasher = blake3::Hasher::new();
    for bytes in files {
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    }
    hasher.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-memory include gives the same object as the same text read
    /// from disk, and a name missing from the map is an error naming the
    /// directive's position and the names that exist.
    #[test]
    fn in_memory_includes() {
        let opts = Options::default();
        let mut includes = BTreeMap::new();
        includes.insert(
            "k.inc".to_string(),
            ".equ K, 3\n.macro twice\nnop\nnop\n.endm\n".to_string(),
        );
        let main = ".text\n.include \"k.inc\"\nf:\ntwice\nsetzi $m0, K\nexit\n";
        let a = assemble_source_in_memory("main.S", main, &includes, &opts).unwrap();
        let inlined = main.replace(".include \"k.inc\"\n", &includes["k.inc"]);
        let b = assemble_source("main.S", &inlined, Path::new("."), &opts).unwrap();
        assert_eq!(a.object, b.object);
        assert_eq!(
            a.files,
            vec![PathBuf::from("main.S"), PathBuf::from("k.inc")]
        );

        let err = assemble_source_in_memory("main.S", ".include \"Cargo.toml\"", &includes, &opts)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "main.S:1:10: error: cannot find include file \"Cargo.toml\" (in-memory sources: k.inc)"
        );
    }
}
