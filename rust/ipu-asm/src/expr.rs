//! Constant and relocatable expressions: `+ - * / % << >> & | ^ ~ !`,
//! comparisons, `&& ||`, parentheses, integers and symbols.
//!
//! A value is either a constant or a relocatable `symbol + addend`; only
//! `+` and `-` with a constant apply to the latter (and the difference of
//! two labels of one section, which is constant). Errors carry the byte
//! offset in the expression text so the caller can report a column.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Const(i64),
    Sym { name: String, addend: i64 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExprError {
    pub offset: usize,
    pub message: String,
}

impl fmt::Display for ExprError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// What identifiers mean while evaluating.
pub trait Scope {
    /// A constant (`.equ`, `.set`, `-D`).
    fn constant(&self, name: &str) -> Option<i64>;
    /// The (section, offset) of a label defined so far.
    fn label(&self, name: &str) -> Option<(usize, u32)>;
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Num(i64),
    Ident(String),
    Op(&'static str),
    LParen,
    RParen,
}

// Two-character operators come first so that `<<` never reads as `<`.
const OPS: [&str; 20] = [
    "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "+", "-", "*", "/", "%", "&", "|", "^", "~",
    "!", "<", ">",
];

pub fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == '.'
}

pub fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$'
}

fn tokenize(text: &str) -> Result<Vec<(usize, Tok)>, ExprError> {
    let mut out = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        if c.is_ascii_digit() {
            while i < b.len() && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let t = &text[start..i];
            let v = ipu_isa::parse_int(t).ok_or_else(|| ExprError {
                offset: start,
                message: format!("`{t}` is not an integer"),
            })?;
            out.push((start, Tok::Num(v)));
        } else if c == '\'' {
            // A character literal 'x'.
            if b.len() >= i + 3 && b[i + 2] == b'\'' && b[i + 1].is_ascii() {
                out.push((start, Tok::Num(b[i + 1] as i64)));
                i += 3;
            } else {
                return Err(ExprError {
                    offset: start,
                    message: "bad character literal".into(),
                });
            }
        } else if is_ident_start(c) {
            while i < b.len() && is_ident_char(b[i] as char) {
                i += 1;
            }
            out.push((start, Tok::Ident(text[start..i].to_string())));
        } else if c == '(' {
            out.push((start, Tok::LParen));
            i += 1;
        } else if c == ')' {
            out.push((start, Tok::RParen));
            i += 1;
        } else if let Some(op) = OPS.iter().find(|op| text[i..].starts_with(**op)) {
            out.push((start, Tok::Op(op)));
            i += op.len();
        } else {
            let ch = text[i..].chars().next().unwrap_or('?');
            return Err(ExprError {
                offset: start,
                message: format!("unexpected character `{ch}` in expression"),
            });
        }
    }
    Ok(out)
}

struct Parser<'a> {
    toks: Vec<(usize, Tok)>,
    pos: usize,
    end: usize,
    scope: &'a dyn Scope,
    depth: u32,
}

const LEVELS: [&[&str]; 10] = [
    &["||"],
    &["&&"],
    &["|"],
    &["^"],
    &["&"],
    &["==", "!="],
    &["<", "<=", ">", ">="],
    &["<<", ">>"],
    &["+", "-"],
    &["*", "/", "%"],
];

impl Parser<'_> {
    fn offset(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end, |t| t.0)
    }
    fn err<T>(&self, offset: usize, message: impl Into<String>) -> Result<T, ExprError> {
        Err(ExprError {
            offset,
            message: message.into(),
        })
    }

    fn binary(&mut self, level: usize) -> Result<Value, ExprError> {
        if level == LEVELS.len() {
            return self.unary();
        }
        let mut lhs = self.binary(level + 1)?;
        loop {
            let op = match self.toks.get(self.pos) {
                Some((_, Tok::Op(op))) if LEVELS[level].contains(op) => *op,
                _ => break,
            };
            let at = self.offset();
            self.pos += 1;
            let rhs = self.binary(level + 1)?;
            lhs = self.apply(op, lhs, rhs, at)?;
        }
        Ok(lhs)
    }

    fn apply(&self, op: &str, l: Value, r: Value, at: usize) -> Result<Value, ExprError> {
        let overflow = || ExprError {
            offset: at,
            message: format!("arithmetic overflow in `{op}`"),
        };
        match (l, r) {
            (Value::Const(a), Value::Const(b)) => {
                let v = match op {
                    "+" => a.checked_add(b).ok_or_else(overflow)?,
                    "-" => a.checked_sub(b).ok_or_else(overflow)?,
                    "*" => a.checked_mul(b).ok_or_else(overflow)?,
                    "/" | "%" => {
                        if b == 0 {
                            return self.err(at, "division by zero");
                        }
                        if op == "/" {
                            a.checked_div(b).ok_or_else(overflow)?
                        } else {
                            a.checked_rem(b).ok_or_else(overflow)?
                        }
                    }
                    "<<" | ">>" => {
                        if !(0..64).contains(&b) {
                            return self.err(at, format!("shift amount {b} outside 0..63"));
                        }
                        if op == "<<" {
                            a.checked_shl(b as u32).ok_or_else(overflow)?
                        } else {
                            a >> b
                        }
                    }
                    "&" => a & b,
                    "|" => a | b,
                    "^" => a ^ b,
                    "==" => (a == b) as i64,
                    "!=" => (a != b) as i64,
                    "<" => (a < b) as i64,
                    "<=" => (a <= b) as i64,
                    ">" => (a > b) as i64,
                    ">=" => (a >= b) as i64,
                    "&&" => (a != 0 && b != 0) as i64,
                    "||" => (a != 0 || b != 0) as i64,
                    _ => return self.err(at, format!("unknown operator `{op}`")),
                };
                Ok(Value::Const(v))
            }
            (Value::Sym { name, addend }, Value::Const(b)) if op == "+" || op == "-" => {
                let addend = if op == "+" {
                    addend.checked_add(b)
                } else {
                    addend.checked_sub(b)
                }
                .ok_or_else(overflow)?;
                Ok(Value::Sym { name, addend })
            }
            (Value::Const(a), Value::Sym { name, addend }) if op == "+" => Ok(Value::Sym {
                name,
                addend: addend.checked_add(a).ok_or_else(overflow)?,
            }),
            (
                Value::Sym {
                    name: n1,
                    addend: a1,
                },
                Value::Sym {
                    name: n2,
                    addend: a2,
                },
            ) if op == "-" => match (self.scope.label(&n1), self.scope.label(&n2)) {
                (Some((s1, o1)), Some((s2, o2))) if s1 == s2 => Ok(Value::Const(
                    o1 as i64 - o2 as i64 + a1 - a2,
                )),
                _ => self.err(
                    at,
                    format!(
                        "`{n1} - {n2}` is not constant: both must be labels of one section defined before this line"
                    ),
                ),
            },
            (Value::Sym { name, .. }, _) | (_, Value::Sym { name, .. }) => self.err(
                at,
                format!(
                    "`{op}` cannot apply to `{name}`, which is not a constant (undefined, or a label: only `+`/`-` of a constant apply to labels)"
                ),
            ),
        }
    }

    fn unary(&mut self) -> Result<Value, ExprError> {
        self.depth += 1;
        if self.depth > 200 {
            return self.err(self.offset(), "expression nested too deeply");
        }
        let at = self.offset();
        let r = match self.toks.get(self.pos).cloned() {
            Some((_, Tok::Op(op))) if matches!(op, "-" | "+" | "~" | "!") => {
                self.pos += 1;
                match (op, self.unary()?) {
                    ("+", v) => Ok(v),
                    ("-", Value::Const(v)) => v.checked_neg().map(Value::Const).ok_or(ExprError {
                        offset: at,
                        message: "arithmetic overflow in `-`".into(),
                    }),
                    ("~", Value::Const(v)) => Ok(Value::Const(!v)),
                    ("!", Value::Const(v)) => Ok(Value::Const((v == 0) as i64)),
                    (_, Value::Sym { name, .. }) => self.err(
                        at,
                        format!("`{op}` cannot apply to `{name}`, which is not a constant"),
                    ),
                    _ => unreachable!("matched above"),
                }
            }
            Some((_, Tok::Num(v))) => {
                self.pos += 1;
                Ok(Value::Const(v))
            }
            Some((_, Tok::Ident(name))) => {
                self.pos += 1;
                Ok(match self.scope.constant(&name) {
                    Some(v) => Value::Const(v),
                    None => Value::Sym { name, addend: 0 },
                })
            }
            Some((_, Tok::LParen)) => {
                self.pos += 1;
                let v = self.binary(0)?;
                match self.toks.get(self.pos) {
                    Some((_, Tok::RParen)) => {
                        self.pos += 1;
                        Ok(v)
                    }
                    _ => self.err(self.offset(), "expected `)`"),
                }
            }
            Some((o, t)) => self.err(o, format!("expected a value, found {}", show(&t))),
            None => self.err(
                self.end,
                "expected a value, found the end of the expression",
            ),
        };
        self.depth -= 1;
        r
    }
}

fn show(t: &Tok) -> String {
    match t {
        Tok::Num(v) => format!("`{v}`"),
        Tok::Ident(s) => format!("`{s}`"),
        Tok::Op(o) => format!("`{o}`"),
        Tok::LParen => "`(`".into(),
        Tok::RParen => "`)`".into(),
    }
}

/// Evaluates `text` in `scope`.
pub fn eval(text: &str, scope: &dyn Scope) -> Result<Value, ExprError> {
    let toks = tokenize(text)?;
    let mut p = Parser {
        toks,
        pos: 0,
        end: text.len(),
        scope,
        depth: 0,
    };
    if p.toks.is_empty() {
        return p.err(0, "expected an expression");
    }
    let v = p.binary(0)?;
    if p.pos != p.toks.len() {
        let (o, t) = p.toks[p.pos].clone();
        return p.err(o, format!("unexpected {} after the expression", show(&t)));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct S;
    impl Scope for S {
        fn constant(&self, name: &str) -> Option<i64> {
            (name == "K").then_some(64)
        }
        fn label(&self, name: &str) -> Option<(usize, u32)> {
            match name {
                "a" => Some((0, 8)),
                "b" => Some((0, 20)),
                "c" => Some((1, 0)),
                _ => None,
            }
        }
    }

    fn ev(t: &str) -> String {
        match eval(t, &S) {
            Ok(Value::Const(v)) => v.to_string(),
            Ok(Value::Sym { name, addend }) => format!("{name}{addend:+}"),
            Err(e) => format!("error at {}: {}", e.offset, e.message),
        }
    }

    #[test]
    fn precedence_and_operators() {
        let cases = [
            ("1 + 2 * 3", "7"),
            ("(1 + 2) * 3", "9"),
            ("K / 16 % 3", "1"),
            ("1 << 4 | 3", "19"),
            ("~0 & 0xff", "255"),
            ("-K + 1", "-63"),
            ("K > 32 && K <= 64", "1"),
            ("K >= 65 || !1", "0"),
            ("5 ^ 3", "6"),
            ("K == 64", "1"),
            ("K != 64", "0"),
            ("0b101 >> 1", "2"),
            ("'A'", "65"),
            ("a + 4", "a+4"),
            ("8 + a - 2", "a+6"),
            ("b - a", "12"),
            ("ext - 4", "ext-4"),
            ("1 / 0", "error at 2: division by zero"),
            ("a * 2", "error at 2: `*` cannot apply to `a`, which is not a constant (undefined, or a label: only `+`/`-` of a constant apply to labels)"),
            ("c - a", "error at 2: `c - a` is not constant: both must be labels of one section defined before this line"),
            ("(1 + 2", "error at 6: expected `)`"),
            ("1 2", "error at 2: unexpected `2` after the expression"),
            ("1 << 64", "error at 2: shift amount 64 outside 0..63"),
            ("0x7fffffffffffffff + 1", "error at 19: arithmetic overflow in `+`"),
            ("3 @ 4", "error at 2: unexpected character `@` in expression"),
            ("", "error at 0: expected an expression"),
        ];
        for (input, want) in cases {
            assert_eq!(ev(input), want, "{input}");
        }
    }
}
