//! The `.ipug` parser. See docs/graph-format.md for the grammar.
//!
//! The parser builds the graph through the [`Graph`] builder, so every
//! statement is type-checked as it is read and an error points at the exact
//! file, line and column of the statement at fault.
//!
//! A `repeat` block is expanded as it is read: its body's statements are
//! replayed once per iteration with the names they define renamed
//! (`name.i`) and the carried values threaded from one iteration to the
//! next, so the graph holds plain SSA statements and every later phase
//! (verifier, reference, compiler) sees an ordinary model.

use std::collections::BTreeMap;
use std::fmt;

use crate::graph::{Graph, GraphError, ValueId};
use crate::lexer::{lex_line, Token, TokenKind};
use crate::ops::{Op, TypeError, DEFAULT_LAYERNORM_EPSILON};
use crate::types::{DType, Shape, TensorType};

/// Words that start a declaration or a block and so cannot name values.
pub const KEYWORDS: [&str; 6] = ["model", "input", "param", "output", "repeat", "end"];

/// The most iterations a `repeat` block may have: the block is expanded
/// into the graph, so a count is a size, and a typo of a few digits must
/// be an error, not a graph of billions of nodes.
pub const MAX_REPEAT: usize = 4096;

/// Operation names the parser knows (`matmul` is another name for `gemm`).
pub const OPERATIONS: [&str; 11] = [
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
    "transpose",
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
    /// A `repeat` block without its `end`.
    UnclosedRepeat,
    /// `end` outside a `repeat` block.
    EndWithoutRepeat,
    /// A statement a `repeat` body may not hold (`model`, `input`,
    /// `output` or another `repeat`).
    NotInRepeat {
        /// The statement's keyword.
        what: String,
        /// Line of the open `repeat`.
        repeat_line: usize,
    },
    /// A carried value that an iteration of the body does not define.
    CarryNotDefined(String),
    /// An error in one iteration of a `repeat` body.
    InRepeat {
        /// 0-based iteration.
        iteration: usize,
        /// Line of the `repeat` statement.
        repeat_line: usize,
        /// The error.
        error: Box<ParseErrorKind>,
    },
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
            UnclosedRepeat => write!(f, "this `repeat` block has no `end`"),
            EndWithoutRepeat => write!(f, "`end` without a `repeat` block"),
            NotInRepeat { what, repeat_line } => write!(
                f,
                "a repeat body holds params and operations only, not `{what}` (the repeat at line {repeat_line} is open: declare inputs and outputs outside the block, close it with `end`; blocks do not nest)"
            ),
            CarryNotDefined(name) => write!(
                f,
                "the repeat body does not define the carried value `{name}` (one statement `{name} = ...` gives the next iteration's `{name}`)"
            ),
            InRepeat {
                iteration,
                repeat_line,
                error,
            } => write!(
                f,
                "{error} (in iteration {iteration} of the repeat at line {repeat_line})"
            ),
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
    parse_with_repeats(file, text).map(|(graph, _)| graph)
}

/// One `repeat` block as the parser expanded it: which graph values each
/// iteration defined, so that a compiler may compile the body once and run
/// it in a loop instead of placing every iteration on its own. The graph
/// itself holds only the expanded statements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repeat {
    /// Line of the `repeat` statement.
    pub line: usize,
    /// The number of iterations.
    pub count: usize,
    /// Each carried value: its name in the body (the graph name of the last
    /// iteration's value) and the graph value the first iteration reads.
    pub carries: Vec<(String, String)>,
    /// Per iteration, the graph names of the values its statements define
    /// (params and operation results), in body order: entry `j` of every
    /// iteration is the same statement.
    pub defined: Vec<Vec<String>>,
}

/// Like [`parse`], and also returns the `repeat` blocks in text order.
pub fn parse_with_repeats(file: &str, text: &str) -> Result<(Graph, Vec<Repeat>), ParseError> {
    let mut parser = Parser {
        file,
        line: 0,
        graph: None,
        model_at: (0, 0),
        defined_at: BTreeMap::new(),
        outputs: 0,
        frame: None,
        repeats: Vec::new(),
    };
    let mut block: Option<RepeatBlock> = None;
    for (index, line) in text.lines().enumerate() {
        parser.line = index + 1;
        let tokens = lex_line(line)
            .map_err(|e| parser.error(e.column, ParseErrorKind::UnexpectedCharacter(e.found)))?;
        if tokens.len() <= 1 {
            continue;
        }
        let word = match &tokens[0].kind {
            TokenKind::Ident(w) => w.as_str(),
            _ => "",
        };
        match (block.as_mut(), word) {
            (None, "repeat") => block = Some(parser.repeat_header(&tokens)?),
            (None, "end") => {
                return Err(parser.error(tokens[0].column, ParseErrorKind::EndWithoutRepeat))
            }
            (None, _) => parser.statement(&tokens)?,
            (Some(_), "end") => {
                let mut cur = Cursor {
                    tokens: &tokens,
                    pos: 1,
                };
                parser.end(&mut cur)?;
                let b = block.take().expect("matched above");
                parser.expand(b)?;
            }
            (Some(b), "repeat" | "model" | "input" | "output") => {
                return Err(parser.error(
                    tokens[0].column,
                    ParseErrorKind::NotInRepeat {
                        what: word.to_string(),
                        repeat_line: b.line,
                    },
                ))
            }
            (Some(b), _) => b.body.push((index + 1, tokens)),
        }
    }
    if let Some(b) = block {
        return Err(ParseError {
            file: file.to_string(),
            line: b.line,
            column: b.column,
            kind: ParseErrorKind::UnclosedRepeat,
        });
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
        Some(graph) => Ok((graph, parser.repeats)),
    }
}

struct Parser<'a> {
    file: &'a str,
    line: usize,
    graph: Option<Graph>,
    model_at: (usize, usize),
    defined_at: BTreeMap<String, (usize, usize)>,
    outputs: usize,
    /// The iteration of a `repeat` body being replayed.
    frame: Option<Frame>,
    /// The blocks expanded so far.
    repeats: Vec<Repeat>,
}

/// A `repeat N carry a = x, b = y` block as read, before expansion.
struct RepeatBlock {
    line: usize,
    column: usize,
    count: usize,
    /// (carried name, the outer value it starts from).
    carries: Vec<(String, String)>,
    /// The body's statements: (line, tokens).
    body: Vec<(usize, Vec<Token>)>,
    /// Names the body defines (other than the carried ones).
    defines: std::collections::BTreeSet<String>,
}

/// How names read in one iteration of a `repeat` body.
struct Frame {
    iteration: usize,
    count: usize,
    /// Each carried name and the graph value it names now.
    carries: BTreeMap<String, String>,
    /// Carried names the iteration has defined so far.
    carried_defined: std::collections::BTreeSet<String>,
    /// A carried value being defined by the current statement: (name, its
    /// new graph name), applied once the statement has read its operands.
    pending: Option<(String, String)>,
    defines: std::collections::BTreeSet<String>,
}

impl Frame {
    /// The graph name of `name` used in this iteration.
    fn use_name(&self, name: &str) -> String {
        if let Some(current) = self.carries.get(name) {
            current.clone()
        } else if self.defines.contains(name) {
            format!("{name}.{}", self.iteration)
        } else {
            name.to_string()
        }
    }
    /// The graph name of `name` defined in this iteration: `name.i`, and
    /// for a carried value the name itself in the last iteration.
    fn def_name(&self, name: &str) -> String {
        if self.carries.contains_key(name) && self.iteration + 1 == self.count {
            name.to_string()
        } else {
            format!("{name}.{}", self.iteration)
        }
    }
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

    fn value_name(&mut self, cur: &mut Cursor) -> Result<(String, usize), ParseError> {
        let (name, column) = self.ident(cur, "a value name")?;
        if KEYWORDS.contains(&name.as_str()) || name == "true" || name == "false" {
            return Err(self.error(column, ParseErrorKind::ReservedName(name)));
        }
        // In a repeat body the name is the iteration's own.
        let name = match self.frame.as_mut() {
            Some(frame) => {
                let renamed = frame.def_name(&name);
                if frame.carries.contains_key(&name) {
                    if !frame.carried_defined.insert(name.clone()) {
                        return Err(self.error(
                            column,
                            ParseErrorKind::Redefinition {
                                previous: self.defined_at.get(&renamed).copied().unwrap_or((0, 0)),
                                name,
                            },
                        ));
                    }
                    // The carried name reads as the new value only after
                    // this statement (`h = add(h, m)` reads the old one).
                    frame.pending = Some((name, renamed.clone()));
                }
                renamed
            }
            None => name,
        };
        if let Some(&previous) = self.defined_at.get(&name) {
            return Err(self.error(column, ParseErrorKind::Redefinition { name, previous }));
        }
        Ok((name, column))
    }

    /// Reads `repeat N carry a = x, b = y`.
    fn repeat_header(&self, tokens: &[Token]) -> Result<RepeatBlock, ParseError> {
        if self.graph.is_none() {
            return Err(self.error(tokens[0].column, ParseErrorKind::MissingModel));
        }
        let mut cur = Cursor { tokens, pos: 1 };
        let t = cur.next();
        let count = match &t.kind {
            TokenKind::Number(n) => match n.parse::<usize>() {
                Ok(c) if (1..=MAX_REPEAT).contains(&c) => c,
                _ => {
                    return Err(self.error(
                        t.column,
                        ParseErrorKind::BadAttributeValue {
                            name: "repeat count".into(),
                            expected: "a whole number from 1 to 4096",
                            found: n.clone(),
                        },
                    ))
                }
            },
            _ => return Err(self.expected(t, "the repeat count")),
        };
        let t = cur.next();
        if t.kind != TokenKind::Ident("carry".into()) {
            return Err(self.expected(t, "`carry NAME = VALUE`"));
        }
        let mut carries: Vec<(String, String)> = Vec::new();
        loop {
            let (name, column) = self.ident(&mut cur, "a carried value name")?;
            if KEYWORDS.contains(&name.as_str()) || name == "true" || name == "false" {
                return Err(self.error(column, ParseErrorKind::ReservedName(name)));
            }
            if let Some(&previous) = self.defined_at.get(&name) {
                return Err(self.error(column, ParseErrorKind::Redefinition { name, previous }));
            }
            if carries.iter().any(|(c, _)| *c == name) {
                return Err(self.error(column, ParseErrorKind::DuplicateAttribute(name)));
            }
            self.punct(&mut cur, '=')?;
            let (init, init_column) = self.ident(&mut cur, "the value it starts from")?;
            self.lookup(&init, init_column)?;
            carries.push((name, init));
            let t = cur.next();
            match t.kind {
                TokenKind::Punct(',') => continue,
                TokenKind::End => break,
                _ => return Err(self.expected(t, "`,` or end of line")),
            }
        }
        Ok(RepeatBlock {
            line: self.line,
            column: tokens[0].column,
            count,
            carries,
            body: Vec::new(),
            defines: Default::default(),
        })
    }

    /// Replays a repeat body once per iteration.
    fn expand(&mut self, mut block: RepeatBlock) -> Result<(), ParseError> {
        // The names the body defines: the first word of an operation
        // statement and the name of a param.
        for (_, tokens) in &block.body {
            let name = match (&tokens[0].kind, tokens.get(1).map(|t| &t.kind)) {
                (TokenKind::Ident(w), Some(TokenKind::Ident(n))) if w == "param" => n,
                (TokenKind::Ident(n), _) => n,
                _ => continue,
            };
            if !block.carries.iter().any(|(c, _)| c == name) {
                block.defines.insert(name.clone());
            }
        }
        let mut carries: BTreeMap<String, String> = block.carries.iter().cloned().collect();
        let mut defined = Vec::new();
        for iteration in 0..block.count {
            let first_value = self.graph.as_ref().map_or(0, |g| g.values().len());
            self.frame = Some(Frame {
                iteration,
                count: block.count,
                carries: carries.clone(),
                carried_defined: Default::default(),
                pending: None,
                defines: block.defines.clone(),
            });
            let in_repeat = |e: ParseError| ParseError {
                kind: ParseErrorKind::InRepeat {
                    iteration,
                    repeat_line: block.line,
                    error: Box::new(e.kind),
                },
                ..e
            };
            for (line, tokens) in &block.body {
                self.line = *line;
                self.statement(tokens).map_err(in_repeat)?;
            }
            let frame = self.frame.take().expect("set above");
            if let Some((name, _)) = block
                .carries
                .iter()
                .find(|(c, _)| !frame.carried_defined.contains(c))
            {
                return Err(ParseError {
                    file: self.file.to_string(),
                    line: block.line,
                    column: block.column,
                    kind: ParseErrorKind::CarryNotDefined(name.clone()),
                });
            }
            carries = frame.carries;
            // Every statement of the body defines one graph value, so the
            // values added by this iteration are its definitions in order.
            let graph = self
                .graph
                .as_ref()
                .expect("a repeat follows the model line");
            defined.push(
                graph.values()[first_value..]
                    .iter()
                    .map(|v| v.name.clone())
                    .collect(),
            );
        }
        self.repeats.push(Repeat {
            line: block.line,
            count: block.count,
            carries: block.carries.clone(),
            defined,
        });
        Ok(())
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
                if let Some(frame) = self.frame.as_mut() {
                    if let Some((carried, renamed)) = frame.pending.take() {
                        frame.carries.insert(carried, renamed);
                    }
                }
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
        let graph_name = match &self.frame {
            Some(frame) => frame.use_name(name),
            None => name.to_string(),
        };
        self.graph
            .as_ref()
            .and_then(|g| g.lookup(&graph_name))
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
            "add" | "gelu" | "softmax" | "merge_heads" | "transpose" => "no attributes",
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
            "transpose" => Op::Transpose,
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
