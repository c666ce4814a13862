//! A text format for phases and descriptor tables, used by the data-driven
//! tests (tests/data/*.txt) and for reading schedules.
//!
//! ```text
//! # comment
//! tiles 4
//! transfer 7: 0 0x80000 -> 1 0xb4000, 2 0xb4000 bytes 32
//! ```
//! A `transfer` line gives id, source tile, source address, then the
//! destinations as `tile address` pairs separated by commas, then the byte
//! count. `span TILE START END` lines, if any, give the phase's spans
//! ([`Phase::spans`]: strided descriptors only inside them; without them,
//! anywhere). Numbers are decimal or `0x` hexadecimal.

use crate::lower::Lowered;
use crate::phase::{Destination, Phase, Transfer};
use std::fmt::{self, Write};

/// A syntax error with its 1-based line and column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextError {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.column, self.message)
    }
}

impl std::error::Error for TextError {}

/// Tokens of one line with their 1-based columns; `:`, `,` and `->` are tokens.
fn tokens(line: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b':' || c == b',' {
            out.push((i + 1, &line[i..i + 1]));
            i += 1;
        } else if line[i..].starts_with("->") {
            out.push((i + 1, &line[i..i + 2]));
            i += 2;
        } else {
            let start = i;
            while i < bytes.len()
                && !bytes[i].is_ascii_whitespace()
                && bytes[i] != b':'
                && bytes[i] != b','
                && !line[i..].starts_with("->")
            {
                i += 1;
            }
            out.push((start + 1, &line[start..i]));
        }
    }
    out
}

struct Cursor<'a> {
    line: usize,
    end_column: usize,
    toks: Vec<(usize, &'a str)>,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn err(&self, column: usize, message: String) -> TextError {
        TextError {
            line: self.line,
            column,
            message,
        }
    }

    fn next(&mut self, what: &str) -> Result<(usize, &'a str), TextError> {
        let t = self.toks.get(self.pos).copied().ok_or_else(|| {
            self.err(
                self.end_column,
                format!("expected {what} before the end of the line"),
            )
        })?;
        self.pos += 1;
        Ok(t)
    }

    fn number(&mut self, what: &str) -> Result<u32, TextError> {
        let (col, t) = self.next(what)?;
        let parsed = match t.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => t.parse(),
        };
        parsed.map_err(|_| self.err(col, format!("expected {what}, found `{t}`")))
    }

    fn expect(&mut self, word: &str) -> Result<(), TextError> {
        let (col, t) = self.next(&format!("`{word}`"))?;
        if t == word {
            Ok(())
        } else {
            Err(self.err(col, format!("expected `{word}`, found `{t}`")))
        }
    }

    fn peek(&self) -> Option<&'a str> {
        self.toks.get(self.pos).map(|t| t.1)
    }
}

/// Parses a phase.
pub fn parse_phase(text: &str) -> Result<Phase, TextError> {
    let mut tiles: Option<u32> = None;
    let mut transfers = Vec::new();
    let mut spans: Option<Vec<Vec<(u32, u32)>>> = None;
    for (n, raw) in text.lines().enumerate() {
        let content = raw.split('#').next().unwrap_or("");
        let mut c = Cursor {
            line: n + 1,
            end_column: content.len() + 1,
            toks: tokens(content),
            pos: 0,
        };
        let Some(&(col, head)) = c.toks.first() else {
            continue;
        };
        c.pos = 1;
        match head {
            "tiles" => {
                if tiles.is_some() {
                    return Err(c.err(col, "`tiles` given twice".into()));
                }
                tiles = Some(c.number("a tile count")?);
            }
            "transfer" => {
                let id = c.number("a transfer id")?;
                c.expect(":")?;
                let source = c.number("a source tile")?;
                let source_address = c.number("a source address")?;
                c.expect("->")?;
                let mut destinations = Vec::new();
                loop {
                    let tile = c.number("a destination tile")?;
                    let address = c.number("a destination address")?;
                    destinations.push(Destination { tile, address });
                    if c.peek() == Some(",") {
                        c.pos += 1;
                    } else {
                        break;
                    }
                }
                c.expect("bytes")?;
                let bytes = c.number("a byte count")?;
                transfers.push(Transfer {
                    id,
                    source,
                    source_address,
                    destinations,
                    bytes,
                });
            }
            "span" => {
                let (tile_col, _) = c.toks.get(c.pos).copied().unwrap_or((col, ""));
                let tile = c.number("a tile")?;
                let start = c.number("a span start")?;
                let end = c.number("a span end")?;
                if tile >= ipu_arch::TILES_PER_CHIP {
                    return Err(c.err(tile_col, format!("tile {tile} is not on a chip")));
                }
                let all = spans.get_or_insert_with(Vec::new);
                if all.len() <= tile as usize {
                    all.resize(tile as usize + 1, Vec::new());
                }
                all[tile as usize].push((start, end));
            }
            other => return Err(c.err(col, format!("unknown directive `{other}`"))),
        }
        if let Some(&(col, t)) = c.toks.get(c.pos) {
            return Err(c.err(col, format!("unexpected `{t}` at the end of the line")));
        }
    }
    let tiles = tiles.ok_or(TextError {
        line: 1,
        column: 1,
        message: "missing `tiles` line".into(),
    })?;
    Ok(Phase {
        tiles,
        transfers,
        spans,
    })
}

/// Prints a phase in the format [`parse_phase`] reads (addresses in
/// hexadecimal), for example to capture a compiler's phase for
/// `exchange-bench`.
pub fn print_phase(phase: &Phase) -> String {
    let mut s = format!("tiles {}\n", phase.tiles);
    for t in &phase.transfers {
        let _ = write!(
            s,
            "transfer {}: {} {:#x} ->",
            t.id, t.source, t.source_address
        );
        for (i, d) in t.destinations.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(s, "{sep} {} {:#x}", d.tile, d.address);
        }
        let _ = writeln!(s, " bytes {}", t.bytes);
    }
    for (tile, spans) in phase.spans.iter().flatten().enumerate() {
        for (start, end) in spans {
            let _ = writeln!(s, "span {tile} {start:#x} {end:#x}");
        }
    }
    s
}

/// Prints tables, one tile per block, skipping empty tables.
pub fn print_tables(lowered: &Lowered) -> String {
    let mut s = String::new();
    for (tile, table) in lowered.tables.iter().enumerate() {
        if table.is_empty() {
            continue;
        }
        let _ = writeln!(s, "tile {tile}:");
        for d in table {
            let _ = writeln!(s, "  {d}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{parse_phase, print_phase};
    use crate::rng::SplitMix64;
    use crate::synth;

    /// Printing then parsing gives the phase back, destinations in their
    /// order.
    #[test]
    fn print_phase_round_trips() {
        let mut rng = SplitMix64(5);
        for case in 0..20 {
            let phase = synth::random(&mut rng, 1 + case, 30, 9, 4);
            let text = print_phase(&phase);
            assert_eq!(parse_phase(&text), Ok(phase), "case {case}:\n{text}");
        }
    }
}
