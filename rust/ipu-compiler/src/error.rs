//! The compiler's error type: every variant names the file, value, tile,
//! kernel or symbol at fault.

use std::fmt;
use std::path::PathBuf;

#[derive(Debug)]
pub enum CompileError {
    /// A file could not be read or written.
    Io { path: PathBuf, message: String },
    /// The model does not parse or verify (the message names file:line:column).
    Model { message: String },
    /// The options are unusable.
    Options { message: String },
    /// The model uses something this compiler cannot lower yet.
    Unsupported {
        value: String,
        operation: String,
        reason: String,
    },
    /// No candidate plan of an operation fits tile memory.
    NoFeasiblePlan { value: String, reason: String },
    /// A tile's buffers do not fit its memory.
    OutOfMemory {
        tile: u32,
        region: &'static str,
        needed: u64,
        available: u64,
        /// The largest consumers, (buffer, bytes), largest first.
        largest: Vec<(String, u64)>,
    },
    /// The kernel library index or a kernel in it is unusable.
    KernelLibrary { path: PathBuf, message: String },
    /// No kernel object provides what a vertex needs.
    MissingKernel { kernel: String, searched: String },
    /// The generated tile program does not assemble or link (a compiler bug,
    /// reported with the tile so the program can be reproduced).
    CodeGen { tile: u32, message: String },
    /// A verifier between two phases rejected the intermediate result (a
    /// compiler bug, reported with the phase that produced it).
    Verifier {
        phase: &'static str,
        message: String,
    },
    /// The package could not be built or written.
    Package { message: String },
    /// A compile that tried again after earlier attempts failed (a smaller
    /// share of region 0 for an attention, segments of their own, the
    /// fallbacks of region 1): the last attempt's error, and what each
    /// earlier one hit and what the next changed, so that an error that
    /// a retry's own limits caused names its first cause too.
    Retried {
        error: Box<CompileError>,
        attempts: Vec<String>,
    },
}

impl CompileError {
    /// The error itself, behind the attempts of a [`CompileError::Retried`].
    pub fn root(&self) -> &CompileError {
        match self {
            CompileError::Retried { error, .. } => error.root(),
            e => e,
        }
    }
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompileError::Io { path, message } => write!(f, "{}: {message}", path.display()),
            CompileError::Model { message } => write!(f, "{message}"),
            CompileError::Options { message } => write!(f, "invalid compile options: {message}"),
            CompileError::Unsupported {
                value,
                operation,
                reason,
            } => write!(
                f,
                "value `{value}` ({operation}): not supported by this compiler yet: {reason}"
            ),
            CompileError::NoFeasiblePlan { value, reason } => {
                write!(f, "value `{value}`: no plan fits the tiles: {reason}")
            }
            CompileError::OutOfMemory {
                tile,
                region,
                needed,
                available,
                largest,
            } => {
                write!(
                    f,
                    "tile {tile}: {region} needs {needed} bytes but {available} are available; largest consumers:"
                )?;
                for (name, bytes) in largest {
                    write!(f, " {name} {bytes} B;")?;
                }
                Ok(())
            }
            CompileError::KernelLibrary { path, message } => {
                write!(f, "kernel library {}: {message}", path.display())
            }
            CompileError::MissingKernel { kernel, searched } => {
                write!(
                    f,
                    "no kernel object provides {kernel} (searched {searched})"
                )
            }
            CompileError::CodeGen { tile, message } => {
                write!(f, "tile {tile}: generated program: {message}")
            }
            CompileError::Verifier { phase, message } => {
                write!(
                    f,
                    "internal error: the result of phase `{phase}` is invalid: {message}"
                )
            }
            CompileError::Package { message } => write!(f, "package: {message}"),
            CompileError::Retried { error, attempts } => {
                write!(f, "{error}")?;
                write!(
                    f,
                    "\n  after {} earlier attempt{}:",
                    attempts.len(),
                    if attempts.len() == 1 { "" } else { "s" }
                )?;
                for (i, a) in attempts.iter().enumerate() {
                    write!(f, "\n  {}. {a}", i + 1)?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for CompileError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A retried compile's error reads as the last attempt's, then the
    /// earlier attempts numbered one a line; `root` finds the last
    /// attempt's error through nested retries.
    #[test]
    fn retried_errors_name_their_attempts_and_their_root() {
        let last = CompileError::NoFeasiblePlan {
            value: "o".into(),
            reason: "no query blocking fits".into(),
        };
        let e = CompileError::Retried {
            error: Box::new(CompileError::Retried {
                error: Box::new(last),
                attempts: vec!["a".into()],
            }),
            attempts: vec![
                "tile 0: region 0 (standard) needs 331136 bytes; then a smaller share".into(),
            ],
        };
        assert!(matches!(e.root(), CompileError::NoFeasiblePlan { value, .. } if value == "o"));
        let text = e.to_string();
        assert!(
            text.starts_with("value `o`: no plan fits the tiles: no query blocking fits")
                && text.ends_with(
                    "\n  after 1 earlier attempt:\n  1. tile 0: region 0 (standard) needs 331136 bytes; then a smaller share"
                ),
            "{text}"
        );
    }
}
