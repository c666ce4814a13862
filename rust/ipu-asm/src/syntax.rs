//! Line-level syntax: comments, labels, the operation word, comma-separated
//! arguments (with their columns) and string literals.

use crate::expr::{is_ident_char, is_ident_start};

/// Cuts a `#` or `//` comment that is not inside a string literal.
pub fn strip_comment(text: &str) -> &str {
    let b = text.as_bytes();
    let mut in_str = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if in_str => i += 1,
            b'"' => in_str = !in_str,
            b'#' if !in_str => return &text[..i],
            b'/' if !in_str && b.get(i + 1) == Some(&b'/') => return &text[..i],
            _ => {}
        }
        i += 1;
    }
    text
}

/// A piece of a line and its 1-based column.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Piece {
    pub text: String,
    pub col: u32,
}

/// One statement: leading labels, then an optional operation with arguments.
#[derive(Clone, Debug, Default)]
pub struct Stmt {
    pub labels: Vec<Piece>,
    pub op: Option<Piece>,
    /// Everything after the operation word.
    pub rest: Piece,
}

fn col_of(line: &str, part: &str) -> u32 {
    // `part` is a sub-slice of `line`; columns count characters.
    let offset = part.as_ptr() as usize - line.as_ptr() as usize;
    line[..offset].chars().count() as u32 + 1
}

/// Splits a (comment-free) line into labels, operation word and the rest.
pub fn split_statement(line: &str) -> Stmt {
    let mut stmt = Stmt::default();
    let mut rest = line.trim_start();
    loop {
        let ident_len = rest
            .char_indices()
            .take_while(|(i, c)| {
                if *i == 0 {
                    is_ident_start(*c)
                } else {
                    is_ident_char(*c)
                }
            })
            .map(|(i, c)| i + c.len_utf8())
            .last()
            .unwrap_or(0);
        if ident_len > 0 && rest[ident_len..].starts_with(':') {
            stmt.labels.push(Piece {
                text: rest[..ident_len].to_string(),
                col: col_of(line, rest),
            });
            rest = rest[ident_len + 1..].trim_start();
        } else {
            break;
        }
    }
    let rest = rest.trim_end();
    if rest.is_empty() {
        stmt.rest = Piece {
            text: String::new(),
            col: line.chars().count() as u32 + 1,
        };
        return stmt;
    }
    if rest.starts_with('{') {
        stmt.op = Some(Piece {
            text: "{".into(),
            col: col_of(line, rest),
        });
        stmt.rest = Piece {
            text: rest.to_string(),
            col: col_of(line, rest),
        };
        return stmt;
    }
    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    stmt.op = Some(Piece {
        text: rest[..end].to_string(),
        col: col_of(line, rest),
    });
    let after = rest[end..].trim_start();
    stmt.rest = Piece {
        text: after.to_string(),
        col: if after.is_empty() {
            col_of(line, rest) + rest.chars().count() as u32
        } else {
            col_of(line, after)
        },
    };
    stmt
}

/// Splits arguments at top-level commas (not inside (), [], {} or strings).
/// Empty input gives no arguments; empty arguments are kept (and rejected by
/// whoever reads them).
pub fn split_args(rest: &Piece) -> Vec<Piece> {
    let text = rest.text.as_str();
    if text.trim().is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut in_str = false;
    let mut start = 0;
    let mut escaped = false;
    let push = |out: &mut Vec<Piece>, s: usize, e: usize| {
        let raw = &text[s..e];
        let lead = raw.len() - raw.trim_start().len();
        out.push(Piece {
            text: raw.trim().to_string(),
            col: rest.col + text[..s + lead].chars().count() as u32,
        });
    };
    for (i, c) in text.char_indices() {
        if in_str {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth <= 0 => {
                push(&mut out, start, i);
                start = i + 1;
            }
            _ => {}
        }
    }
    push(&mut out, start, text.len());
    out
}

/// Reads a double-quoted string literal with `\" \\ \n \t` escapes.
pub fn string_literal(text: &str) -> Result<String, String> {
    let inner = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .filter(|_| text.len() >= 2)
        .ok_or_else(|| format!("expected a string in double quotes, found `{text}`"))?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('"') => out.push('"'),
                Some('\\') => out.push('\\'),
                other => {
                    return Err(format!(
                        "unknown escape `\\{}` in string",
                        other.map_or(String::new(), String::from)
                    ))
                }
            }
        } else if c == '"' {
            return Err("unescaped `\"` inside a string".into());
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// Whether `name` is a valid symbol name.
pub fn is_identifier(name: &str) -> bool {
    let mut cs = name.chars();
    cs.next().is_some_and(is_ident_start) && cs.all(is_ident_char)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_and_arguments() {
        let s = split_statement("  loop: .Lx:  add $m0, $m1, (K + 1) * 2");
        assert_eq!(
            s.labels
                .iter()
                .map(|p| (p.text.as_str(), p.col))
                .collect::<Vec<_>>(),
            [("loop", 3), (".Lx", 9)]
        );
        let op = s.op.unwrap();
        assert_eq!((op.text.as_str(), op.col), ("add", 15));
        let args = split_args(&s.rest);
        assert_eq!(
            args.iter()
                .map(|p| (p.text.as_str(), p.col))
                .collect::<Vec<_>>(),
            [("$m0", 19), ("$m1", 24), ("(K + 1) * 2", 29)]
        );
        assert_eq!(strip_comment("a \"#x\" # c // d"), "a \"#x\" ");
        assert_eq!(strip_comment("a // c"), "a ");
        assert_eq!(string_literal(r#""a\"b\n""#).unwrap(), "a\"b\n");
        assert!(string_literal("\"abc").is_err());
        let b = split_statement("{ ld64 $a0:1, [$m0+8] ; f16v4add $a2:3, $a2:3, $a0:1 }");
        assert_eq!(b.op.unwrap().text, "{");
    }
}
