//! Splits one line of `.ipug` text into tokens with 1-based columns.

/// What a token is.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenKind {
    /// An identifier or keyword: `[A-Za-z_][A-Za-z0-9_.]*`.
    Ident(String),
    /// A number as written: optional sign, digits, optional fraction and exponent.
    Number(String),
    /// One of `: = ( ) [ ] , < >`.
    Punct(char),
    /// The end of the line (or the start of a `#` comment).
    End,
}

impl TokenKind {
    /// How the token reads in an error message.
    pub fn describe(&self) -> String {
        match self {
            TokenKind::Ident(s) => format!("`{s}`"),
            TokenKind::Number(s) => format!("number `{s}`"),
            TokenKind::Punct(c) => format!("`{c}`"),
            TokenKind::End => "end of line".to_string(),
        }
    }
}

/// A token and the column of its first character.
#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    /// What it is.
    pub kind: TokenKind,
    /// 1-based column, counted in characters.
    pub column: usize,
}

/// A character that cannot start any token, with its column.
#[derive(Clone, Debug, PartialEq)]
pub struct LexError {
    /// The character.
    pub found: char,
    /// 1-based column.
    pub column: usize,
}

/// Tokenises `line`; the result always ends with [`TokenKind::End`].
pub fn lex_line(line: &str) -> Result<Vec<Token>, LexError> {
    let chars: Vec<char> = line.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let column = i + 1;
        if c == '#' {
            break;
        }
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '.')
            {
                i += 1;
            }
            tokens.push(Token {
                kind: TokenKind::Ident(chars[start..i].iter().collect()),
                column,
            });
            continue;
        }
        let starts_number = c.is_ascii_digit()
            || ((c == '-' || c == '+' || c == '.')
                && chars
                    .get(i + 1)
                    .is_some_and(|n| n.is_ascii_digit() || *n == '.'));
        if starts_number {
            let start = i;
            i += 1;
            while i < chars.len() {
                let d = chars[i];
                let exponent_sign = (d == '-' || d == '+') && matches!(chars[i - 1], 'e' | 'E');
                if d.is_ascii_digit() || d == '.' || d == 'e' || d == 'E' || exponent_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            tokens.push(Token {
                kind: TokenKind::Number(chars[start..i].iter().collect()),
                column,
            });
            continue;
        }
        if ":=()[],<>".contains(c) {
            tokens.push(Token {
                kind: TokenKind::Punct(c),
                column,
            });
            i += 1;
            continue;
        }
        return Err(LexError { found: c, column });
    }
    let end_column = i.min(chars.len()) + 1;
    tokens.push(Token {
        kind: TokenKind::End,
        column: end_column,
    });
    Ok(tokens)
}
