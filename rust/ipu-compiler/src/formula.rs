//! Evaluates a kernel's declared cycle formula (`.cycles "..."` in the
//! kernel source, `cycles` in kernel.json), so that the cost model uses what
//! the kernel declares instead of a second copy of it.
//!
//! Grammar: integers, variables (`[A-Za-z_][A-Za-z0-9_]*`), `+ - * /`
//! (integer, `/` rounds down), `ceil(a/b)` with `a` a product (rounds up),
//! parentheses.

use std::collections::BTreeMap;

/// Evaluates `formula` with `vars`; the error names the position and problem.
pub fn evaluate(formula: &str, vars: &BTreeMap<&str, i64>) -> Result<i64, String> {
    let tokens = tokenize(formula)?;
    let mut p = Parser {
        tokens,
        pos: 0,
        vars,
        formula,
    };
    let v = p.sum()?;
    if p.pos != p.tokens.len() {
        return Err(format!("`{formula}`: unexpected `{}`", p.tokens[p.pos]));
    }
    Ok(v)
}

fn tokenize(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if "+-*/()".contains(c) {
            out.push(c.to_string());
            i += 1;
        } else {
            return Err(format!("`{s}`: unexpected character `{c}` at {i}"));
        }
    }
    Ok(out)
}

struct Parser<'a> {
    tokens: Vec<String>,
    pos: usize,
    vars: &'a BTreeMap<&'a str, i64>,
    formula: &'a str,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.pos).map(|s| s.as_str())
    }
    fn expect(&mut self, t: &str) -> Result<(), String> {
        if self.peek() == Some(t) {
            self.pos += 1;
            Ok(())
        } else {
            Err(format!("`{}`: expected `{t}`", self.formula))
        }
    }
    fn sum(&mut self) -> Result<i64, String> {
        let mut v = self.product()?;
        while let Some(op @ ("+" | "-")) = self.peek() {
            let add = op == "+";
            self.pos += 1;
            let r = self.product()?;
            v = if add { v + r } else { v - r };
        }
        Ok(v)
    }
    fn product(&mut self) -> Result<i64, String> {
        self.product_with(true)
    }
    /// A product; without `divide`, a `/` ends it (the numerator of `ceil`).
    fn product_with(&mut self, divide: bool) -> Result<i64, String> {
        let mut v = self.atom()?;
        while let Some(op @ ("*" | "/")) = self.peek() {
            if op == "/" && !divide {
                break;
            }
            let mul = op == "*";
            self.pos += 1;
            let r = self.atom()?;
            v = if mul {
                v * r
            } else if r == 0 {
                return Err(format!("`{}`: division by zero", self.formula));
            } else {
                v.div_euclid(r)
            };
        }
        Ok(v)
    }
    fn atom(&mut self) -> Result<i64, String> {
        let t = self
            .peek()
            .ok_or_else(|| format!("`{}`: unexpected end", self.formula))?
            .to_string();
        self.pos += 1;
        if t == "(" {
            let v = self.sum()?;
            self.expect(")")?;
            Ok(v)
        } else if t == "-" {
            Ok(-self.atom()?)
        } else if t == "ceil" {
            self.expect("(")?;
            let a = self.product_with(false)?;
            self.expect("/")?;
            let b = self.sum()?;
            self.expect(")")?;
            if b <= 0 {
                return Err(format!(
                    "`{}`: ceil divisor {b} is not positive",
                    self.formula
                ));
            }
            Ok((a + b - 1).div_euclid(b))
        } else if let Ok(n) = t.parse::<i64>() {
            Ok(n)
        } else if let Some(&v) = self.vars.get(t.as_str()) {
            Ok(v)
        } else {
            Err(format!("`{}`: unknown variable `{t}`", self.formula))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas() {
        let vars: BTreeMap<&str, i64> = [("M", 10), ("K", 33)].into_iter().collect();
        assert_eq!(
            evaluate("6 * (14 + 2 * (4 * M + 51))", &vars),
            Ok(6 * (14 + 2 * 91))
        );
        assert_eq!(evaluate("ceil(K/16) * 3 - 1", &vars), Ok(8));
        assert_eq!(evaluate("K / 16", &vars), Ok(2));
        assert!(evaluate("M +", &vars)
            .unwrap_err()
            .contains("unexpected end"));
        assert!(evaluate("N", &vars)
            .unwrap_err()
            .contains("unknown variable `N`"));
        assert!(evaluate("M $ 2", &vars)
            .unwrap_err()
            .contains("unexpected character"));
    }
}
