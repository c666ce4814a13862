//! The `.ipug` parser. See docs/graph-format.md for the grammar.
//!
//! The parser builds the graph through the [`Graph`] builder, so every
//! statement is type-checked as it is read and an error points at the exact
//! file, line and column of the statement at fault.

use std::collections::BTreeMap;
use std::fmt;

use crate::graph::{Graph, GraphError, ValueId};
use crate::lexer::{lex_line, Token, TokenKind};
use crate::ops::{Op, TypeError, DEFAULT_LAYERNORM_EPSILON};
use crate::types::{DType, Shape, TensorType};

/// Words that start a declaration and so cannot name values.
pub const KEYWORDS: [&str; 4] = ["model", "input", "param", "output"];

/// Operation names the parser knows (`matmul` is another name for `gemm`).
pub const OPERATIONS: [&str; 10] = [
    "add",
    "attention",
    "cast",
    "gelu",
    "gemm",
    "layernorm",
    "matmul",
    "merge_heads",
    "softmax",
    "split_heads",
];

/// What is wrong at a location.
#[derive(Clone, Debug, PartialEq)]
pub enum ParseErrorKind {
    /// A character that starts no token.
    UnexpectedCharacter(char),
    /// The parser wanted one thing and found another.
    Expected {
        /// What would have been accepted.
        expected: String,
        /// What was there.
        found: String,
    },
    /// The first statement is not `model NAME`.
    MissingModel,
    /// A second `model` line.
    DuplicateModel {
        /// Where the first one is.
        previous: (usize, usize),
    },
    /// An operation name the parser does not know.
    UnknownOp(String),
    /// An attribute the operation does not take.
    UnknownAttribute {
        /// Operation.
        op: String,
        /// The attribute given.
        name: String,
        /// The attributes it takes.
        accepted: &'static str,
    },
    /// The same attribute twice.
    DuplicateAttribute(String),
    /// A required attribute is absent.
    MissingAttribute {
        /// Operation.
        op: String,
        /// The attribute.
        name: &'static str,
    },
    /// An attribute value of the wrong kind or out of range.
    BadAttributeValue {
        /// The attribute.
        name: String,
        /// What it must be.
        expected: &'static str,
        /// What was given.
        found: String,
    },
    /// A positional operand after a keyword attribute.
    PositionalAfterAttribute,
    /// A number that does not parse or is out of range.
    BadNumber(String),
    /// A use of a name no earlier statement defines.
    Undefined(String),
    /// A second definition of a name.
    Redefinition {
        /// The name.
        name: String,
        /// Where it was first defined.
        previous: (usize, usize),
    },
    /// A keyword used as a value name.
    ReservedName(String),
    /// A dimension of zero.
    ZeroDimension(TensorType),
    /// The operation rejects its operands.
    Type(TypeError),
    /// A result annotation that differs from the inferred type.
    AnnotationMismatch {
        /// The value.
        name: String,
        /// As written.
        declared: TensorType,
        /// As inferred.
        inferred: TensorType,
    },
    /// A value listed as output twice.
    DuplicateOutput(String),
    /// The file declares no output.
    NoOutputs,
}

/// A parse error with its location.
#[derive(Clone, Debug, PartialEq)]
pub struct ParseError {
    /// The file name given to the parser.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub kind: ParseErrorKind,
}

impl fmt::Display for ParseErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ParseErrorKind::*;
        match self {
            UnexpectedCharacter(c) => write!(f, "unexpected character `{c}`"),
            Expected { expected, found } => write!(f, "expected {expected}, found {found}"),
            MissingModel => write!(f, "expected `model NAME` as the first statement"),
            DuplicateModel { previous } => {
                write!(
                    f,
                    "second `model` statement (the first is at {}:{})",
                    previous.0, previous.1
                )
            }
            UnknownOp(op) => write!(
                f,
                "unknown operation `{op}` (known: {})",
                OPERATIONS.join(", ")
            ),
            UnknownAttribute { op, name, accepted } => {
                write!(f, "{op} has no attribute `{name}` (it takes: {accepted})")
            }
            DuplicateAttribute(name) => write!(f, "attribute `{name}` is given twice"),
            MissingAttribute { op, name } => write!(f, "{op} needs the attribute `{name}`"),
            BadAttributeValue {
                name,
                expected,
                found,
            } => {
                write!(f, "attribute `{name}` must be {expected}, found {found}")
            }
            PositionalAfterAttribute => write!(f, "operands must come before attributes"),
            BadNumber(s) => write!(f, "invalid number `{s}`"),
            Undefined(name) => write!(f, "undefined value `{name}`"),
            Redefinition { name, previous } => write!(
                f,
                "redefinition of `{name}` (first defined at {}:{})",
                previous.0, previous.1
            ),
            ReservedName(name) => write!(f, "`{name}` is a keyword and cannot name a value"),
            ZeroDimension(t) => write!(f, "type {t} has a zero dimension"),
            Type(e) => write!(f, "{e}"),
            AnnotationMismatch {
                name,
                declared,
                inferred,
            } => write!(
                f,
                "`{name}` is annotated {declared} but the operation gives {inferred}"
            ),
            DuplicateOutput(name) => write!(f, "`{name}` is already an output"),
            NoOutputs => write!(f, "the model declares no output (add `output NAME`)"),
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: error: {}",
            self.file, self.line, self.column, self.kind
        )
    }
}

impl std::error::Error for ParseError {}

/// Parses `.ipug` text. `file` is used only in error messages.
pub fn parse(file: &str, text: &str) -> Result<Graph, ParseError> {
    let mut parser = Parser {
        file,
        line: 0,
        graph: None,
        model_at: (0, 0),
        defined_at: BTreeMap::new(),
        outputs: 0,
    };
    for (index, line) in text.lines().enumerate() {
        parser.line = index + 1;
        let tokens = lex_line(line)
            .map_err(|e| parser.error(e.column, ParseErrorKind::UnexpectedCharacter(e.found)))?;
        if tokens.len() > 1 {
            parser.statement(&tokens)?;
        }
    }
    let end_line = text.lines().count().max(1);
    match parser.graph {
        None => Err(ParseError {
            file: file.to_string(),
            line: end_line,
            column: 1,
            kind: ParseErrorKind::MissingModel,
        }),
        Some(_) if parser.outputs == 0 => Err(ParseError {
            file: file.to_string(),
            line: end_line,
            column: 1,
            kind: ParseErrorKind::NoOutputs,
        }),
        Some(graph) => Ok(graph),
    }
}

struct Parser<'a> {
    file: &'a str,
    line: usize,
    graph: Option<Graph>,
    model_at: (usize, usize),
    defined_at: BTreeMap<String, (usize, usize)>,
    outputs: usize,
}

/// A cursor over one line's tokens.
struct Cursor<'t> {
    tokens: &'t [Token],
    pos: usize,
}

impl<'t> Cursor<'t> {
    fn peek(&self) -> &'t Token {
        &self.tokens[self.pos]
    }
    fn peek2(&self) -> &'t Token {
        &self.tokens[(self.pos + 1).min(self.tokens.len() - 1)]
    }
    fn next(&mut self) -> &'t Token {
        let t = &self.tokens[self.pos];
        if self.pos + 1 < self.tokens.len() {
            self.pos += 1;
        }
        t
    }
}

enum Literal {
    Bool(bool),
    Number(String),
    DType(DType),
}

impl Literal {
    fn describe(&self) -> String {
        match self {
            Literal::Bool(b) => format!("`{b}`"),
            Literal::Number(n) => format!("number `{n}`"),
            Literal::DType(d) => format!("dtype `{d}`"),
        }
    }
}

struct Attribute {
    name: String,
    value: Literal,
    column: usize,
}

impl<'a> Parser<'a> {
    fn error(&self, column: usize, kind: ParseErrorKind) -> ParseError {
        ParseError {
            file: self.file.to_string(),
            line: self.line,
            column,
            kind,
        }
    }

    fn expected(&self, token: &Token, expected: &str) -> ParseError {
        self.error(
            token.column,
            ParseErrorKind::Expected {
                expected: expected.to_string(),
                found: token.kind.describe(),
            },
        )
    }

    fn ident(&self, cur: &mut Cursor, what: &str) -> Result<(String, usize), ParseError> {
        let t = cur.next();
        match &t.kind {
            TokenKind::Ident(s) => Ok((s.clone(), t.column)),
            _ => Err(self.expected(t, what)),
        }
    }

    fn punct(&self, cur: &mut Cursor, c: char) -> Result<(), ParseError> {
        let t = cur.next();
        if t.kind == TokenKind::Punct(c) {
            Ok(())
        } else {
            Err(self.expected(t, &format!("`{c}`")))
        }
    }

    fn end(&self, cur: &mut Cursor) -> Result<(), ParseError> {
        let t = cur.next();
        if t.kind == TokenKind::End {
            Ok(())
        } else {
            Err(self.expected(t, "end of line"))
        }
    }

    fn statement(&mut self, tokens: &[Token]) -> Result<(), ParseError> {
        let mut cur = Cursor { tokens, pos: 0 };
        let first = cur.peek();
        let keyword = match &first.kind {
            TokenKind::Ident(s) => s.as_str(),
            _ => {
                return Err(self.expected(
                    first,
                    "a statement (model, input, param, output or NAME = op(...))",
                ))
            }
        };
        if keyword == "model" {
            cur.next();
            let (name, _) = self.ident(&mut cur, "a model name")?;
            self.end(&mut cur)?;
            if self.graph.is_some() {
                return Err(self.error(
                    first.column,
                    ParseErrorKind::DuplicateModel {
                        previous: self.model_at,
                    },
                ));
            }
            self.graph = Some(Graph::new(name));
            self.model_at = (self.line, first.column);
            return Ok(());
        }
        if self.graph.is_none() {
            return Err(self.error(first.column, ParseErrorKind::MissingModel));
        }
        match keyword {
            "input" | "param" => {
                cur.next();
                let (name, column) = self.value_name(&mut cur)?;
                self.punct(&mut cur, ':')?;
                let ty = self.tensor_type(&mut cur)?;
                self.end(&mut cur)?;
                let graph = self.graph.as_mut().expect("model checked above");
                let result = if keyword == "input" {
                    graph.add_input(&name, ty)
                } else {
                    graph.add_param(&name, ty)
                };
                self.defined(result, &name, column)?;
                Ok(())
            }
            "output" => {
                cur.next();
                loop {
                    let (name, column) = self.ident(&mut cur, "an output value name")?;
                    let id = self.lookup(&name, column)?;
                    let graph = self.graph.as_mut().expect("model checked above");
                    graph.add_output(id).map_err(|_| {
                        self.error(column, ParseErrorKind::DuplicateOutput(name.clone()))
                    })?;
                    self.outputs += 1;
                    let t = cur.next();
                    match t.kind {
                        TokenKind::Punct(',') => continue,
                        TokenKind::End => return Ok(()),
                        _ => return Err(self.expected(t, "`,` or end of line")),
                    }
                }
            }
            _ => self.op_statement(&mut cur),
        }
    }

    fn value_name(&self, cur: &mut Cursor) -> Result<(String, usize), ParseError> {
        let (name, column) = self.ident(cur, "a value name")?;
        if KEYWORDS.contains(&name.as_str()) || name == "true" || name == "false" {
            return Err(self.error(column, ParseErrorKind::ReservedName(name)));
        }
        if let Some(&previous) = self.defined_at.get(&name) {
            return Err(self.error(column, ParseErrorKind::Redefinition { name, previous }));
        }
        Ok((name, column))
    }

    fn defined(
        &mut self,
        result: Result<ValueId, GraphError>,
        name: &str,
        column: usize,
    ) -> Result<ValueId, ParseError> {
        match result {
            Ok(id) => {
                self.defined_at
                    .insert(name.to_string(), (self.line, column));
                Ok(id)
            }
            Err(GraphError::ZeroDimension { ty, .. }) => {
                Err(self.error(column, ParseErrorKind::ZeroDimension(ty)))
            }
            Err(e) => Err(self.error(
                column,
                ParseErrorKind::Expected {
                    expected: "a new value name".into(),
                    found: e.to_string(),
                },
            )),
        }
    }

    fn lookup(&self, name: &str, column: usize) -> Result<ValueId, ParseError> {
        self.graph
            .as_ref()
            .and_then(|g| g.lookup(name))
            .ok_or_else(|| self.error(column, ParseErrorKind::Undefined(name.to_string())))
    }

    fn dtype(&self, cur: &mut Cursor) -> Result<DType, ParseError> {
        let t = cur.next();
        let name = match &t.kind {
            TokenKind::Ident(s) => s.as_str(),
            _ => return Err(self.expected(t, "a dtype (f32, f16, fp8 or fp8<scale>)")),
        };
        match name {
            "f32" => Ok(DType::F32),
            "f16" => Ok(DType::F16),
            "fp8" => {
                if cur.peek().kind != TokenKind::Punct('<') {
                    return Ok(DType::Fp8 { scale_log2: 0 });
                }
                cur.next();
                let n = cur.next();
                let scale_log2 = match &n.kind {
                    TokenKind::Number(s) => s
                        .parse::<i8>()
                        .map_err(|_| self.error(n.column, ParseErrorKind::BadNumber(s.clone())))?,
                    _ => return Err(self.expected(n, "an integer fp8 scale exponent")),
                };
                self.punct(cur, '>')?;
                Ok(DType::Fp8 { scale_log2 })
            }
            _ => Err(self.expected(t, "a dtype (f32, f16, fp8 or fp8<scale>)")),
        }
    }

    fn tensor_type(&self, cur: &mut Cursor) -> Result<TensorType, ParseError> {
        let start = cur.peek().column;
        let dtype = self.dtype(cur)?;
        self.punct(cur, '[')?;
        let mut dims = Vec::new();
        if cur.peek().kind == TokenKind::Punct(']') {
            cur.next();
        } else {
            loop {
                let t = cur.next();
                match &t.kind {
                    TokenKind::Number(s) => {
                        let d = s.parse::<usize>().map_err(|_| {
                            self.error(t.column, ParseErrorKind::BadNumber(s.clone()))
                        })?;
                        dims.push(d);
                    }
                    _ => return Err(self.expected(t, "a dimension")),
                }
                let t = cur.next();
                match t.kind {
                    TokenKind::Punct(',') => continue,
                    TokenKind::Punct(']') => break,
                    _ => return Err(self.expected(t, "`,` or `]`")),
                }
            }
        }
        let ty = TensorType {
            dtype,
            shape: Shape(dims),
        };
        if ty.shape.dims().contains(&0) {
            return Err(self.error(start, ParseErrorKind::ZeroDimension(ty)));
        }
        Ok(ty)
    }

    fn literal(&self, cur: &mut Cursor) -> Result<Literal, ParseError> {
        let t = cur.peek();
        match &t.kind {
            TokenKind::Ident(s) if s == "true" => {
                cur.next();
                Ok(Literal::Bool(true))
            }
            TokenKind::Ident(s) if s == "false" => {
                cur.next();
                Ok(Literal::Bool(false))
            }
            TokenKind::Ident(_) => Ok(Literal::DType(self.dtype(cur)?)),
            TokenKind::Number(s) => {
                cur.next();
                Ok(Literal::Number(s.clone()))
            }
            _ => Err(self.expected(t, "an attribute value (true, false, a number or a dtype)")),
        }
    }

    fn op_statement(&mut self, cur: &mut Cursor) -> Result<(), ParseError> {
        let (name, name_column) = self.value_name(cur)?;
        let annotation = if cur.peek().kind == TokenKind::Punct(':') {
            cur.next();
            let column = cur.peek().column;
            Some((self.tensor_type(cur)?, column))
        } else {
            None
        };
        self.punct(cur, '=')?;
        let (op_name, op_column) = self.ident(cur, "an operation name")?;
        self.punct(cur, '(')?;
        let mut operands: Vec<(ValueId, usize)> = Vec::new();
        let mut attributes: Vec<Attribute> = Vec::new();
        if cur.peek().kind == TokenKind::Punct(')') {
            cur.next();
        } else {
            loop {
                let is_attribute = matches!(cur.peek().kind, TokenKind::Ident(_))
                    && cur.peek2().kind == TokenKind::Punct('=');
                if is_attribute {
                    let (attr, column) = self.ident(cur, "an attribute name")?;
                    cur.next();
                    if attributes.iter().any(|a| a.name == attr) {
                        return Err(self.error(column, ParseErrorKind::DuplicateAttribute(attr)));
                    }
                    let value = self.literal(cur)?;
                    attributes.push(Attribute {
                        name: attr,
                        value,
                        column,
                    });
                } else {
                    let (operand, column) = self.ident(cur, "an operand name or attribute")?;
                    if !attributes.is_empty() {
                        return Err(self.error(column, ParseErrorKind::PositionalAfterAttribute));
                    }
                    operands.push((self.lookup(&operand, column)?, column));
                }
                let t = cur.next();
                match t.kind {
                    TokenKind::Punct(',') => continue,
                    TokenKind::Punct(')') => break,
                    _ => return Err(self.expected(t, "`,` or `)`")),
                }
            }
        }
        self.end(cur)?;
        let op = self.build_op(&op_name, op_column, &attributes)?;
        let args: Vec<ValueId> = operands.iter().map(|o| o.0).collect();
        let graph = self.graph.as_mut().expect("model checked above");
        let result = graph.add_op(&name, op, &args);
        let id = match result {
            Err(GraphError::Type { error, .. }) => {
                return Err(self.error(op_column, ParseErrorKind::Type(error)))
            }
            other => self.defined(other, &name, name_column)?,
        };
        if let Some((declared, column)) = annotation {
            let inferred = self
                .graph
                .as_ref()
                .expect("model checked above")
                .ty(id)
                .clone();
            if declared != inferred {
                return Err(self.error(
                    column,
                    ParseErrorKind::AnnotationMismatch {
                        name,
                        declared,
                        inferred,
                    },
                ));
            }
        }
        Ok(())
    }

    fn build_op(
        &self,
        op: &str,
        column: usize,
        attributes: &[Attribute],
    ) -> Result<Op, ParseError> {
        let accepted: &'static str = match op {
            "gemm" | "matmul" => "transpose_a, transpose_b, out",
            "layernorm" => "epsilon",
            "split_heads" => "heads",
            "attention" => "causal, scale",
            "cast" => "to",
            "add" | "gelu" | "softmax" | "merge_heads" => "no attributes",
            _ => return Err(self.error(column, ParseErrorKind::UnknownOp(op.to_string()))),
        };
        for a in attributes {
            if !accepted.split(", ").any(|n| n == a.name) {
                return Err(self.error(
                    a.column,
                    ParseErrorKind::UnknownAttribute {
                        op: op.to_string(),
                        name: a.name.clone(),
                        accepted,
                    },
                ));
            }
        }
        let find = |name: &str| attributes.iter().find(|a| a.name == name);
        let bad = |a: &Attribute, expected: &'static str| {
            self.error(
                a.column,
                ParseErrorKind::BadAttributeValue {
                    name: a.name.clone(),
                    expected,
                    found: a.value.describe(),
                },
            )
        };
        let boolean = |name: &str| -> Result<Option<bool>, ParseError> {
            match find(name) {
                None => Ok(None),
                Some(Attribute {
                    value: Literal::Bool(b),
                    ..
                }) => Ok(Some(*b)),
                Some(a) => Err(bad(a, "true or false")),
            }
        };
        let float = |name: &str| -> Result<Option<f64>, ParseError> {
            match find(name) {
                None => Ok(None),
                Some(
                    a @ Attribute {
                        value: Literal::Number(n),
                        ..
                    },
                ) => match n.parse::<f64>() {
                    Ok(v) if v.is_finite() => Ok(Some(v)),
                    _ => Err(bad(a, "a finite number")),
                },
                Some(a) => Err(bad(a, "a number")),
            }
        };
        let dtype = |name: &str| -> Result<Option<DType>, ParseError> {
            match find(name) {
                None => Ok(None),
                Some(Attribute {
                    value: Literal::DType(d),
                    ..
                }) => Ok(Some(*d)),
                Some(a) => Err(bad(a, "a dtype")),
            }
        };
        let missing = |name: &'static str| {
            self.error(
                column,
                ParseErrorKind::MissingAttribute {
                    op: op.to_string(),
                    name,
                },
            )
        };
        Ok(match op {
            "gemm" | "matmul" => Op::Gemm {
                transpose_a: boolean("transpose_a")?.unwrap_or(false),
                transpose_b: boolean("transpose_b")?.unwrap_or(false),
                out: dtype("out")?,
            },
            "add" => Op::Add,
            "gelu" => Op::Gelu,
            "softmax" => Op::Softmax,
            "merge_heads" => Op::MergeHeads,
            "layernorm" => Op::LayerNorm {
                epsilon: float("epsilon")?.unwrap_or(DEFAULT_LAYERNORM_EPSILON),
            },
            "split_heads" => {
                let a = find("heads").ok_or_else(|| missing("heads"))?;
                let heads = match &a.value {
                    Literal::Number(n) => n.parse::<usize>().ok().filter(|&h| h > 0),
                    _ => None,
                };
                Op::SplitHeads {
                    heads: heads.ok_or_else(|| bad(a, "a positive integer"))?,
                }
            }
            "attention" => Op::Attention {
                causal: boolean("causal")?.unwrap_or(false),
                scale: float("scale")?,
            },
            "cast" => Op::Cast {
                to: dtype("to")?.ok_or_else(|| missing("to"))?,
            },
            _ => unreachable!("operation names were matched above"),
        })
    }
}
