//! Source locations and assembler errors.

use std::fmt;
use std::rc::Rc;

/// A position in a source file; `line` and `col` are 1-based (0 when the
/// whole file is meant).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loc {
    pub file: Rc<str>,
    pub line: u32,
    pub col: u32,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.file)
        } else {
            write!(f, "{}:{}:{}", self.file, self.line, self.col)
        }
    }
}

/// How a line came to be assembled: the expansions around it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// The line is in the body of macro `name`, expanded at `at`.
    Macro { name: String, at: Loc },
    /// The line is in a file included at `at`.
    Include { at: Loc },
    /// The line is in a `.rept` body (iteration `iteration`, from 0) at `at`.
    Rept { iteration: u64, at: Loc },
}

/// An assembly error: where, what, and the expansion chain (innermost first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsmError {
    pub loc: Loc,
    pub message: String,
    pub context: Vec<Frame>,
}

impl fmt::Display for AsmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: error: {}", self.loc, self.message)?;
        // Runaway recursion repeats one frame many times; print it once with
        // a count so the message stays readable.
        let mut k = 0;
        while k < self.context.len() {
            let frame = &self.context[k];
            let mut n = 1;
            while self.context.get(k + n) == Some(frame) {
                n += 1;
            }
            match frame {
                Frame::Macro { name, at } => write!(f, "\n  in macro `{name}` expanded at {at}")?,
                Frame::Include { at } => write!(f, "\n  included from {at}")?,
                Frame::Rept { iteration, at } => {
                    write!(f, "\n  in .rept iteration {iteration} at {at}")?
                }
            }
            if n > 1 {
                write!(f, " ({n} times)")?;
            }
            k += n;
        }
        Ok(())
    }
}

impl std::error::Error for AsmError {}
