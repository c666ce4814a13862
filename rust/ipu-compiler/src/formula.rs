//! Evaluates a kernel's declared cycle formula (`.cycles "..."` in the
//! kernel source, `cycles` in kernel.json), so that the cost model uses what
//! the kernel declares instead of a second copy of it.
//!
//! Grammar: integers, variables (`[A-Za-z_][A-Za-z0-9_]*`), `+ - * /`
//! (integer, `/` rounds down), `ceil(a/b)` with `a` a product (rounds up),
//! parentheses.
//!
//! A formula is parsed once into a [`Formula`] (a tree over the formula's
//! own variables) and then evaluated for many values: the planners cost
//! millions of worker splits and shards per compile, and reparsing the text
//! (or looking values up in a memo keyed by a fresh vector) was most of
//! their time.

use std::collections::{BTreeMap, HashMap};

/// Evaluates `formula` with `vars`; the error names the position and problem.
pub fn evaluate(formula: &str, vars: &BTreeMap<&str, i64>) -> Result<i64, String> {
    let f = Formula::parse(formula)?;
    let values = f
        .variables()
        .iter()
        .map(|name| {
            vars.get(name.as_str())
                .copied()
                .ok_or_else(|| format!("`{formula}`: unknown variable `{name}`"))
        })
        .collect::<Result<Vec<i64>, String>>()?;
    f.eval(&values)
}

/// A parsed formula: nodes in an arena, each distinct subexpression once
/// (the reduce kernels' formulas repeat `(2 * P) / (P + 9)` and `ROWS / 4`
/// a dozen times), operands before the nodes that read them.
#[derive(Clone, Debug)]
pub struct Formula {
    text: String,
    nodes: Vec<Node>,
    root: usize,
    /// Variable names in order of first use; [`Formula::eval`] takes their
    /// values in this order.
    names: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Node {
    Const(i64),
    Var(usize),
    Neg(usize),
    Add(usize, usize),
    Sub(usize, usize),
    Mul(usize, usize),
    /// `a / b`, rounded down (an error when `b` is 0).
    Div(usize, usize),
    /// `ceil(a / b)` (an error when `b` is not positive).
    Ceil(usize, usize),
}

impl Formula {
    /// Parses `text`; the error names the problem.
    pub fn parse(text: &str) -> Result<Formula, String> {
        Formula::parse_with(text, true)
    }

    /// [`Formula::parse`], with `share` false giving every subexpression
    /// nodes of its own (the tests compare the two).
    fn parse_with(text: &str, share: bool) -> Result<Formula, String> {
        let mut p = Parser {
            tokens: tokenize(text)?,
            pos: 0,
            formula: Formula {
                text: text.to_string(),
                nodes: Vec::new(),
                root: 0,
                names: Vec::new(),
            },
            known: HashMap::new(),
            share,
        };
        p.formula.root = p.sum()?;
        if p.pos != p.tokens.len() {
            return Err(format!("`{text}`: unexpected `{}`", p.tokens[p.pos]));
        }
        Ok(p.formula)
    }

    /// The variables the formula reads, in the order [`Formula::eval`]
    /// takes their values.
    pub fn variables(&self) -> &[String] {
        &self.names
    }

    /// The value with `values[i]` for variable `i` of [`Formula::variables`].
    pub fn eval(&self, values: &[i64]) -> Result<i64, String> {
        self.eval_with(values, &mut Vec::new())
    }

    /// [`Formula::eval`] with the caller's scratch vector (the planners'
    /// hot path allocates nothing).
    pub fn eval_with(&self, values: &[i64], v: &mut Vec<i64>) -> Result<i64, String> {
        assert_eq!(values.len(), self.names.len(), "one value per variable");
        // Children precede their parents in the arena, so one pass in order
        // evaluates every node after its operands.
        v.clear();
        // Kernel metadata is input: a formula whose value leaves i64 is an
        // error, never a wrapped or panicking value.
        let overflow = || format!("`{}`: the value overflows", self.text);
        for node in &self.nodes {
            let x = match *node {
                Node::Const(c) => Some(c),
                Node::Var(i) => Some(values[i]),
                Node::Neg(a) => v[a].checked_neg(),
                Node::Add(a, b) => v[a].checked_add(v[b]),
                Node::Sub(a, b) => v[a].checked_sub(v[b]),
                Node::Mul(a, b) => v[a].checked_mul(v[b]),
                Node::Div(a, b) => {
                    if v[b] == 0 {
                        return Err(format!("`{}`: division by zero", self.text));
                    }
                    v[a].checked_div_euclid(v[b])
                }
                Node::Ceil(a, b) => {
                    if v[b] <= 0 {
                        return Err(format!(
                            "`{}`: ceil divisor {} is not positive",
                            self.text, v[b]
                        ));
                    }
                    v[a].checked_add(v[b] - 1)
                        .and_then(|n| n.checked_div_euclid(v[b]))
                }
            };
            v.push(x.ok_or_else(overflow)?);
        }
        Ok(v[self.root])
    }
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

struct Parser {
    tokens: Vec<String>,
    pos: usize,
    formula: Formula,
    /// Each node's index in the arena.
    known: HashMap<Node, usize>,
    /// Whether an equal node is reused.
    share: bool,
}

impl Parser {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.pos).map(|s| s.as_str())
    }
    fn expect(&mut self, t: &str) -> Result<(), String> {
        if self.peek() == Some(t) {
            self.pos += 1;
            Ok(())
        } else {
            Err(format!("`{}`: expected `{t}`", self.formula.text))
        }
    }
    /// The node's index, added unless an equal node exists: evaluation is
    /// pure, so an equal subexpression has the same value (and the same
    /// error).
    fn push(&mut self, node: Node) -> usize {
        let nodes = &mut self.formula.nodes;
        if !self.share {
            nodes.push(node);
            return nodes.len() - 1;
        }
        *self.known.entry(node).or_insert_with(|| {
            nodes.push(node);
            nodes.len() - 1
        })
    }
    fn sum(&mut self) -> Result<usize, String> {
        let mut v = self.product()?;
        while let Some(op @ ("+" | "-")) = self.peek() {
            let add = op == "+";
            self.pos += 1;
            let r = self.product()?;
            v = self.push(if add {
                Node::Add(v, r)
            } else {
                Node::Sub(v, r)
            });
        }
        Ok(v)
    }
    fn product(&mut self) -> Result<usize, String> {
        self.product_with(true)
    }
    /// A product; without `divide`, a `/` ends it (the numerator of `ceil`).
    fn product_with(&mut self, divide: bool) -> Result<usize, String> {
        let mut v = self.atom()?;
        while let Some(op @ ("*" | "/")) = self.peek() {
            if op == "/" && !divide {
                break;
            }
            let mul = op == "*";
            self.pos += 1;
            let r = self.atom()?;
            v = self.push(if mul {
                Node::Mul(v, r)
            } else {
                Node::Div(v, r)
            });
        }
        Ok(v)
    }
    fn atom(&mut self) -> Result<usize, String> {
        let t = self
            .peek()
            .ok_or_else(|| format!("`{}`: unexpected end", self.formula.text))?
            .to_string();
        self.pos += 1;
        if t == "(" {
            let v = self.sum()?;
            self.expect(")")?;
            Ok(v)
        } else if t == "-" {
            let a = self.atom()?;
            Ok(self.push(Node::Neg(a)))
        } else if t == "ceil" {
            self.expect("(")?;
            let a = self.product_with(false)?;
            self.expect("/")?;
            let b = self.sum()?;
            self.expect(")")?;
            Ok(self.push(Node::Ceil(a, b)))
        } else if let Ok(n) = t.parse::<i64>() {
            Ok(self.push(Node::Const(n)))
        } else if t.starts_with(|c: char| c.is_ascii_digit()) {
            Err(format!(
                "`{}`: `{t}` is neither a number nor a variable",
                self.formula.text
            ))
        } else {
            let names = &mut self.formula.names;
            let i = match names.iter().position(|n| *n == t) {
                Some(i) => i,
                None => {
                    names.push(t);
                    names.len() - 1
                }
            };
            Ok(self.push(Node::Var(i)))
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
        assert_eq!(evaluate("-M / 3", &vars), Ok(-4), "rounds down");
        assert_eq!(evaluate("ceil(-M / 3)", &vars), Ok(-3));
        assert_eq!(evaluate("ceil(2 * M / K - 30)", &vars), Ok(7));
        assert!(evaluate("M +", &vars)
            .unwrap_err()
            .contains("unexpected end"));
        assert!(evaluate("N", &vars)
            .unwrap_err()
            .contains("unknown variable `N`"));
        assert!(evaluate("M $ 2", &vars)
            .unwrap_err()
            .contains("unexpected character"));
        assert!(evaluate("M / (K - 33)", &vars)
            .unwrap_err()
            .contains("division by zero"));
        assert!(evaluate("ceil(M / (K - 40))", &vars)
            .unwrap_err()
            .contains("not positive"));
        assert!(evaluate("3M", &vars).unwrap_err().contains("neither"));
        assert!(evaluate("(M", &vars).unwrap_err().contains("expected `)`"));
        assert!(evaluate("4611686018427387904 * 2 + M", &vars)
            .unwrap_err()
            .contains("overflows"));
        assert!(evaluate("-9223372036854775807 - 1 - M", &vars)
            .unwrap_err()
            .contains("overflows"));
    }

    #[test]
    fn repeated_subexpressions_are_one_node() {
        let f = Formula::parse("(2 * P) / (P + 9) + (2 * P) / (P + 9) * ROWS").unwrap();
        // 2, P, 2 * P, 9, P + 9, the quotient, ROWS, its product, the sum.
        assert_eq!(f.nodes.len(), 9);
        for (p, rows) in [(1, 3), (7, 5), (9, 1), (12, 40)] {
            let q = (2 * p) / (p + 9);
            assert_eq!(
                f.eval(&[p, rows]),
                Ok(q + q * rows),
                "P = {p}, ROWS = {rows}"
            );
        }
        assert_eq!(Formula::parse("(M)").unwrap().eval(&[4]), Ok(4));
    }

    /// Every `.cycles` formula of device/ gives the same values with shared
    /// subexpressions as with a node for each, over a grid of values.
    #[test]
    fn kernel_formulas_evaluate_alike_shared_or_not() {
        let dir = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap())
            .join("../../device");
        let mut formulas = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("device/ is readable") {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "S") {
                let text = std::fs::read_to_string(&path).unwrap();
                for line in text.lines() {
                    if let Some(rest) = line.trim().strip_prefix(".cycles \"") {
                        formulas.push(rest.trim_end_matches('"').to_string());
                    }
                }
            }
        }
        assert!(formulas.len() > 20, "found {} formulas", formulas.len());
        let mut shrunk = 0;
        for text in &formulas {
            let shared = Formula::parse_with(text, true).unwrap();
            let plain = Formula::parse_with(text, false).unwrap();
            assert_eq!(shared.variables(), plain.variables(), "{text}");
            shrunk += usize::from(shared.nodes.len() < plain.nodes.len());
            let n = shared.variables().len() as u32;
            for case in 0..200i64 {
                let values: Vec<i64> = (0..n as i64)
                    .map(|i| 1 + (case * 7 + i * 13 + case * i) % 97)
                    .collect();
                assert_eq!(
                    shared.eval(&values),
                    plain.eval(&values),
                    "{text} at {values:?}"
                );
            }
        }
        assert!(shrunk > 0, "no formula repeats a subexpression");
    }

    #[test]
    fn variables_in_order_of_first_use_and_evaluated_by_position() {
        let f = Formula::parse("NCB * (11 + NKB * (4 * M + 51)) + M").unwrap();
        assert_eq!(f.variables(), ["NCB", "NKB", "M"]);
        assert_eq!(f.eval(&[2, 3, 10]), Ok(2 * (11 + 3 * 91) + 10));
    }
}
