//! The assembler proper: one pass over the (expanded) source that lays out
//! sections, defines symbols and records fixups, then a resolution step that
//! patches branches within a section, turns every other symbol reference into
//! a relocation, checks hardware-loop bodies and builds the object.

use crate::error::{AsmError, Frame, Loc};
use crate::expr::{self, Scope, Value};
use crate::syntax::{self, Piece};
use crate::{Assembly, Options};
use ipu_arch::{TILE_SRAM_BYTES, WORKER_CONTEXTS};
use ipu_isa::{
    assemble_instruction, decode_bundle_bytes, encode_bundle, parse_operand, Bundle, IsaError,
    MemMode, Operand, RelocKind,
};
use ipu_object::{
    Binding, KernelMetadata, Object, RegionConstraint, RegistersUsed, Relocation, Section,
    SectionKind, Symbol, SymbolKind, TOOLCHAIN_VERSION,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Expansion depth (nested includes, macros and .rept) before we assume recursion.
const MAX_DEPTH: usize = 64;
/// Statements processed before we assume a runaway expansion.
const MAX_STATEMENTS: u64 = 5_000_000;

/// One source line with where it came from.
#[derive(Clone, Debug)]
pub(crate) struct Line {
    pub text: String,
    pub file: Rc<str>,
    pub dir: Rc<Path>,
    pub line: u32,
    pub ctx: Rc<Vec<Frame>>,
}

impl Line {
    fn loc(&self, col: u32) -> Loc {
        Loc {
            file: self.file.clone(),
            line: self.line,
            col,
        }
    }
    fn err(&self, col: u32, message: impl Into<String>) -> AsmError {
        AsmError {
            loc: self.loc(col),
            message: message.into(),
            context: self.ctx.as_ref().clone(),
        }
    }
}

pub(crate) fn split_lines(
    text: &str,
    file: Rc<str>,
    dir: Rc<Path>,
    ctx: Rc<Vec<Frame>>,
) -> Vec<Line> {
    text.lines()
        .enumerate()
        .map(|(i, t)| Line {
            text: t.to_string(),
            file: file.clone(),
            dir: dir.clone(),
            line: i as u32 + 1,
            ctx: ctx.clone(),
        })
        .collect()
}

struct SectionBuf {
    name: String,
    kind: SectionKind,
    align: u32,
    region: RegionConstraint,
    bytes: Vec<u8>,
    bss_size: u32,
}

impl SectionBuf {
    fn size(&self) -> u32 {
        match self.kind {
            SectionKind::Bss => self.bss_size,
            _ => self.bytes.len() as u32,
        }
    }
}

struct Macro {
    params: Vec<(String, Option<String>)>,
    body: Vec<Line>,
}

struct PendingFixup {
    section: usize,
    offset: u32,
    kind: RelocKind,
    symbol: String,
    addend: i64,
    line: Line,
    col: u32,
}

struct LabelDef {
    section: usize,
    offset: u32,
    loc: Loc,
}

pub(crate) struct Assembler<'o> {
    opts: &'o Options,
    /// When set, `.include` names are looked up in this map (exact name as
    /// written) and the file system is never read.
    pub(crate) memory_includes: Option<&'o BTreeMap<String, String>>,
    sections: Vec<SectionBuf>,
    current: Option<usize>,
    labels: BTreeMap<String, LabelDef>,
    /// Constants: value and whether `.set` may redefine it.
    constants: BTreeMap<String, (i64, bool)>,
    globals: BTreeSet<String>,
    sizes: BTreeMap<String, u32>,
    entries: Vec<String>,
    macros: BTreeMap<String, Rc<Macro>>,
    fixups: Vec<PendingFixup>,
    /// Per bundle in code: (section, offset, line, column) for the loop checker.
    bundle_lines: Vec<(usize, u32, Line, u32)>,
    m_mask: u16,
    a_mask: u16,
    kernel: Option<String>,
    params: BTreeMap<String, i64>,
    /// Names declared by `.param` (with a default or given by -D).
    declared_params: BTreeSet<String>,
    workers: Option<u32>,
    cycles: Option<String>,
    statements: u64,
    expansions: u64,
    pub(crate) files: Vec<(PathBuf, Vec<u8>)>,
}

struct ScopeRef<'a, 'o>(&'a Assembler<'o>);

impl Scope for ScopeRef<'_, '_> {
    fn constant(&self, name: &str) -> Option<i64> {
        self.0.constants.get(name).map(|c| c.0)
    }
    fn label(&self, name: &str) -> Option<(usize, u32)> {
        self.0.labels.get(name).map(|l| (l.section, l.offset))
    }
}

/// The first word of a line (for block structure), ignoring comments.
fn directive_word(text: &str) -> &str {
    let t = syntax::strip_comment(text).trim_start();
    let end = t.find(char::is_whitespace).unwrap_or(t.len());
    &t[..end]
}

fn isa_error(e: &IsaError) -> String {
    e.to_string()
}

impl<'o> Assembler<'o> {
    pub(crate) fn new(opts: &'o Options) -> Self {
        let constants = opts
            .defines
            .iter()
            .map(|(k, v)| (k.clone(), (*v, false)))
            .collect();
        Assembler {
            opts,
            memory_includes: None,
            sections: Vec::new(),
            current: None,
            labels: BTreeMap::new(),
            constants,
            globals: BTreeSet::new(),
            sizes: BTreeMap::new(),
            entries: Vec::new(),
            macros: BTreeMap::new(),
            fixups: Vec::new(),
            bundle_lines: Vec::new(),
            m_mask: 0,
            a_mask: 0,
            kernel: None,
            params: opts.defines.clone(),
            declared_params: BTreeSet::new(),
            workers: None,
            cycles: None,
            statements: 0,
            expansions: 0,
            files: Vec::new(),
        }
    }

    fn eval(&self, line: &Line, arg: &Piece) -> Result<Value, AsmError> {
        expr::eval(&arg.text, &ScopeRef(self)).map_err(|e| {
            let col = arg.col + arg.text[..e.offset.min(arg.text.len())].chars().count() as u32;
            line.err(col, e.message)
        })
    }

    fn const_expr(&self, line: &Line, arg: &Piece) -> Result<i64, AsmError> {
        match self.eval(line, arg)? {
            Value::Const(v) => Ok(v),
            Value::Sym { name, .. } => Err(line.err(
                arg.col,
                format!("expected a constant expression, but `{name}` is not a constant (undefined, or a label)"),
            )),
        }
    }

    /// Runs a sequence of lines, handling block directives (`.if`, `.macro`,
    /// `.rept`) and `.include` here because they need the following lines.
    pub(crate) fn run(&mut self, lines: &[Line]) -> Result<(), AsmError> {
        let mut i = 0;
        while i < lines.len() {
            let line = &lines[i];
            self.statements += 1;
            if self.statements > MAX_STATEMENTS {
                return Err(line.err(
                    1,
                    format!(
                        "more than {MAX_STATEMENTS} statements: runaway .rept or macro expansion?"
                    ),
                ));
            }
            let word = directive_word(&line.text);
            match word {
                ".if" | ".ifdef" | ".ifndef" => {
                    i = self.conditional(lines, i)?;
                    continue;
                }
                ".macro" => {
                    i = self.define_macro(lines, i)?;
                    continue;
                }
                ".rept" => {
                    i = self.rept(lines, i)?;
                    continue;
                }
                ".else" | ".elseif" | ".endif" | ".endm" | ".endr" => {
                    let col = line.text.find(word).map_or(1, |c| c as u32 + 1);
                    let opener = match word {
                        ".endm" => ".macro",
                        ".endr" => ".rept",
                        _ => ".if",
                    };
                    return Err(line.err(col, format!("`{word}` without a matching `{opener}`")));
                }
                _ => {}
            }
            self.statement(line)?;
            i += 1;
        }
        Ok(())
    }

    /// Finds the line closing the block opened at `start`; returns its index
    /// and the indices of same-level `.else`/`.elseif` lines.
    fn block_end(
        &self,
        lines: &[Line],
        start: usize,
        open: &[&str],
        close: &str,
    ) -> Result<(usize, Vec<usize>), AsmError> {
        let mut depth = 0;
        let mut middles = Vec::new();
        for (j, l) in lines.iter().enumerate().skip(start + 1) {
            let w = directive_word(&l.text);
            if open.contains(&w) {
                depth += 1;
            } else if w == close {
                if depth == 0 {
                    return Ok((j, middles));
                }
                depth -= 1;
            } else if depth == 0 && (w == ".else" || w == ".elseif") && close == ".endif" {
                middles.push(j);
            }
        }
        let l = &lines[start];
        let w = directive_word(&l.text);
        let col = l.text.find(w).map_or(1, |c| c as u32 + 1);
        Err(l.err(col, format!("`{w}` is never closed: expected `{close}`")))
    }

    fn directive_args(line: &Line) -> (u32, Vec<Piece>) {
        let text = syntax::strip_comment(&line.text);
        let stmt = syntax::split_statement(text);
        let col = stmt.op.as_ref().map_or(1, |o| o.col);
        (col, syntax::split_args(&stmt.rest))
    }

    fn condition(&self, line: &Line) -> Result<bool, AsmError> {
        let word = directive_word(&line.text);
        let (col, args) = Self::directive_args(line);
        if args.len() != 1 {
            return Err(line.err(
                col,
                format!("`{word}` expects one argument, got {}", args.len()),
            ));
        }
        Ok(match word {
            ".ifdef" | ".ifndef" => {
                let name = &args[0].text;
                if !syntax::is_identifier(name) {
                    return Err(line.err(args[0].col, format!("expected a name, found `{name}`")));
                }
                let defined = self.constants.contains_key(name) || self.labels.contains_key(name);
                defined == (word == ".ifdef")
            }
            _ => self.const_expr(line, &args[0])? != 0,
        })
    }

    fn conditional(&mut self, lines: &[Line], start: usize) -> Result<usize, AsmError> {
        let (end, middles) =
            self.block_end(lines, start, &[".if", ".ifdef", ".ifndef"], ".endif")?;
        // Branch heads: the opening line and every .elseif/.else.
        let mut heads = vec![start];
        heads.extend(middles.iter().copied());
        let mut seen_else = false;
        for (k, &h) in heads.iter().enumerate() {
            let w = directive_word(&lines[h].text);
            if seen_else {
                let col = lines[h].text.find(w).map_or(1, |c| c as u32 + 1);
                return Err(lines[h].err(col, format!("`{w}` after `.else`")));
            }
            let taken = if w == ".else" {
                seen_else = true;
                let (col, args) = Self::directive_args(&lines[h]);
                if !args.is_empty() {
                    return Err(lines[h].err(col, "`.else` takes no argument"));
                }
                true
            } else if w == ".elseif" {
                let mut l = lines[h].clone();
                l.text = l.text.replacen(".elseif", ".if", 1);
                self.condition(&l)?
            } else {
                self.condition(&lines[h])?
            };
            if taken {
                let body_end = heads.get(k + 1).copied().unwrap_or(end);
                self.run(&lines[h + 1..body_end])?;
                break;
            }
        }
        Ok(end + 1)
    }

    fn define_macro(&mut self, lines: &[Line], start: usize) -> Result<usize, AsmError> {
        let (end, _) = self.block_end(lines, start, &[".macro"], ".endm")?;
        let line = &lines[start];
        let text = syntax::strip_comment(&line.text);
        let stmt = syntax::split_statement(text);
        let rest = stmt.rest.text.trim();
        let name_end = rest.find([' ', '\t', ',']).unwrap_or(rest.len());
        let name = &rest[..name_end];
        if !syntax::is_identifier(name) || name.starts_with('.') {
            return Err(line.err(
                stmt.rest.col,
                format!("expected a macro name, found `{name}`"),
            ));
        }
        if self.macros.contains_key(name) {
            return Err(line.err(stmt.rest.col, format!("macro `{name}` is already defined")));
        }
        let params_piece = Piece {
            text: rest[name_end..]
                .trim_start_matches([' ', '\t', ','])
                .to_string(),
            col: stmt.rest.col + name_end as u32 + 1,
        };
        let mut params = Vec::new();
        for p in syntax::split_args(&params_piece) {
            let (pname, default) = match p.text.split_once('=') {
                Some((n, d)) => (n.trim().to_string(), Some(d.trim().to_string())),
                None => (p.text.clone(), None),
            };
            if !syntax::is_identifier(&pname) || params.iter().any(|(n, _)| *n == pname) {
                return Err(line.err(p.col, format!("bad or repeated macro parameter `{pname}`")));
            }
            params.push((pname, default));
        }
        self.macros.insert(
            name.to_string(),
            Rc::new(Macro {
                params,
                body: lines[start + 1..end].to_vec(),
            }),
        );
        Ok(end + 1)
    }

    fn push_frame(&self, line: &Line, body: &[Line], frame: Frame) -> Result<Vec<Line>, AsmError> {
        if line.ctx.len() >= MAX_DEPTH {
            return Err(line.err(
                1,
                format!(
                    "expansion nested more than {MAX_DEPTH} deep (recursive macro or include?)"
                ),
            ));
        }
        let mut ctx = vec![frame];
        ctx.extend(line.ctx.iter().cloned());
        // The body lines keep their own file:line (where they were written);
        // their expansion chain is the new frame over the expansion site's.
        let ctx = Rc::new(ctx);
        Ok(body
            .iter()
            .map(|l| Line {
                ctx: ctx.clone(),
                ..l.clone()
            })
            .collect())
    }

    fn rept(&mut self, lines: &[Line], start: usize) -> Result<usize, AsmError> {
        let (end, _) = self.block_end(lines, start, &[".rept"], ".endr")?;
        let line = &lines[start];
        let (col, args) = Self::directive_args(line);
        if args.len() != 1 {
            return Err(line.err(col, "`.rept` expects one count"));
        }
        let n = self.const_expr(line, &args[0])?;
        if !(0..=65536).contains(&n) {
            return Err(line.err(args[0].col, format!("`.rept` count {n} outside 0..=65536")));
        }
        for iteration in 0..n as u64 {
            let body = self.push_frame(
                line,
                &lines[start + 1..end],
                Frame::Rept {
                    iteration,
                    at: line.loc(col),
                },
            )?;
            self.run(&body)?;
        }
        Ok(end + 1)
    }

    fn include(&mut self, line: &Line, col: u32, args: &[Piece]) -> Result<(), AsmError> {
        if args.len() != 1 {
            return Err(line.err(col, "`.include` expects one file name in quotes"));
        }
        let name = syntax::string_literal(&args[0].text).map_err(|m| line.err(args[0].col, m))?;
        if let Some(map) = self.memory_includes {
            let Some(text) = map.get(&name) else {
                let known: Vec<&str> = map.keys().map(String::as_str).collect();
                return Err(line.err(
                    args[0].col,
                    format!(
                        "cannot find include file \"{name}\" (in-memory sources: {})",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            };
            let path = PathBuf::from(&name);
            self.files.push((path.clone(), text.as_bytes().to_vec()));
            return self.run_included(line, col, &path, text, line.dir.clone());
        }
        let mut candidates = vec![line.dir.join(&name)];
        candidates.extend(self.opts.include_dirs.iter().map(|d| d.join(&name)));
        let Some(path) = candidates.iter().find(|p| p.is_file()) else {
            let searched: Vec<String> = candidates
                .iter()
                .map(|p| {
                    p.parent()
                        .map_or(String::new(), |d| d.display().to_string())
                })
                .collect();
            return Err(line.err(
                args[0].col,
                format!(
                    "cannot find include file \"{name}\" (searched: {})",
                    searched.join(", ")
                ),
            ));
        };
        let bytes = std::fs::read(path)
            .map_err(|e| line.err(args[0].col, format!("cannot read {}: {e}", path.display())))?;
        let text = String::from_utf8(bytes.clone()).map_err(|e| {
            line.err(
                args[0].col,
                format!(
                    "{} is not UTF-8 (byte {})",
                    path.display(),
                    e.utf8_error().valid_up_to()
                ),
            )
        })?;
        self.files.push((path.clone(), bytes));
        let dir: Rc<Path> = Rc::from(path.parent().unwrap_or(Path::new(".")));
        self.run_included(line, col, path, &text, dir)
    }

    /// Assembles the text of a file included at `line`, one expansion level
    /// deeper than the including line.
    fn run_included(
        &mut self,
        line: &Line,
        col: u32,
        path: &Path,
        text: &str,
        dir: Rc<Path>,
    ) -> Result<(), AsmError> {
        if line.ctx.len() >= MAX_DEPTH {
            return Err(line.err(
                col,
                format!("expansion nested more than {MAX_DEPTH} deep (recursive include?)"),
            ));
        }
        let mut ctx = vec![Frame::Include { at: line.loc(col) }];
        ctx.extend(line.ctx.iter().cloned());
        let lines = split_lines(
            text,
            Rc::from(path.display().to_string()),
            dir,
            Rc::new(ctx),
        );
        self.run(&lines)
    }

    fn expand_macro(
        &mut self,
        line: &Line,
        name: &str,
        op_col: u32,
        args: Vec<Piece>,
    ) -> Result<(), AsmError> {
        let m = self.macros.get(name).cloned().expect("caller checked");
        if args.len() > m.params.len() {
            return Err(line.err(
                op_col,
                format!(
                    "macro `{name}` takes {} arguments, got {}",
                    m.params.len(),
                    args.len()
                ),
            ));
        }
        let mut values = BTreeMap::new();
        for (k, (p, default)) in m.params.iter().enumerate() {
            let v = match args.get(k) {
                Some(a) if !a.text.is_empty() => a.text.clone(),
                _ => default.clone().ok_or_else(|| {
                    line.err(
                        op_col,
                        format!("macro `{name}` needs argument `{p}` (argument {})", k + 1),
                    )
                })?,
            };
            values.insert(p.clone(), v);
        }
        self.expansions += 1;
        let unique = self.expansions.to_string();
        let body: Vec<Line> = m
            .body
            .iter()
            .map(|l| {
                let mut out = String::with_capacity(l.text.len());
                let mut rest = l.text.as_str();
                while let Some(p) = rest.find('\\') {
                    out.push_str(&rest[..p]);
                    let after = &rest[p + 1..];
                    if let Some(a) = after.strip_prefix('@') {
                        out.push_str(&unique);
                        rest = a;
                    } else if let Some(a) = after.strip_prefix("()") {
                        rest = a;
                    } else {
                        let n = after
                            .char_indices()
                            .take_while(|(_, c)| c.is_ascii_alphanumeric() || *c == '_')
                            .map(|(i, c)| i + c.len_utf8())
                            .last()
                            .unwrap_or(0);
                        match values.get(&after[..n]) {
                            Some(v) => {
                                out.push_str(v);
                                rest = &after[n..];
                            }
                            None => {
                                out.push('\\');
                                rest = after;
                            }
                        }
                    }
                }
                out.push_str(rest);
                Line {
                    text: out,
                    ..l.clone()
                }
            })
            .collect();
        let body = self.push_frame(
            line,
            &body,
            Frame::Macro {
                name: name.to_string(),
                at: line.loc(op_col),
            },
        )?;
        self.run(&body)
    }

    fn section_mut(&mut self) -> &mut SectionBuf {
        if self.current.is_none() {
            self.switch_section(".text", SectionKind::Code, RegionConstraint::Standard);
        }
        let i = self.current.expect("set above");
        &mut self.sections[i]
    }

    fn switch_section(&mut self, name: &str, kind: SectionKind, region: RegionConstraint) -> usize {
        if let Some(i) = self.sections.iter().position(|s| s.name == name) {
            self.current = Some(i);
            return i;
        }
        self.sections.push(SectionBuf {
            name: name.to_string(),
            kind,
            align: if kind == SectionKind::Code { 4 } else { 8 },
            region,
            bytes: Vec::new(),
            bss_size: 0,
        });
        self.current = Some(self.sections.len() - 1);
        self.sections.len() - 1
    }

    fn define_label(&mut self, line: &Line, label: &Piece) -> Result<(), AsmError> {
        let name = &label.text;
        if let Some(prev) = self.labels.get(name) {
            return Err(line.err(
                label.col,
                format!("label `{name}` is already defined at {}", prev.loc),
            ));
        }
        if self.constants.contains_key(name) {
            return Err(line.err(label.col, format!("`{name}` is already a constant")));
        }
        let s = self.section_mut();
        let offset = s.size();
        let section = self.current.expect("section_mut sets it");
        self.labels.insert(
            name.clone(),
            LabelDef {
                section,
                offset,
                loc: line.loc(label.col),
            },
        );
        Ok(())
    }

    fn statement(&mut self, line: &Line) -> Result<(), AsmError> {
        let text = syntax::strip_comment(&line.text).to_string();
        let stmt = syntax::split_statement(&text);
        for l in &stmt.labels {
            self.define_label(line, l)?;
        }
        let Some(op) = stmt.op else { return Ok(()) };
        if op.text == "{" {
            return self.bundle(line, &stmt.rest);
        }
        if op.text.starts_with('.') {
            return self.directive(line, &op, &stmt.rest);
        }
        if self.macros.contains_key(&op.text) {
            let args = syntax::split_args(&stmt.rest);
            return self.expand_macro(line, &op.text, op.col, args);
        }
        if !syntax::is_identifier(&op.text) {
            return Err(line.err(
                op.col,
                format!(
                    "expected a label, instruction or directive, found `{}`",
                    op.text
                ),
            ));
        }
        let (ins, fixup) = self.instruction(line, &op, &stmt.rest)?;
        self.emit_bundle(line, op.col, Bundle::Single(ins), [fixup, None])
    }

    /// Turns one operand text into an ipu-isa operand, evaluating expressions.
    fn operand(&self, line: &Line, arg: &Piece) -> Result<Operand, AsmError> {
        let t = arg.text.as_str();
        if t.is_empty() {
            return Err(line.err(arg.col, "empty operand"));
        }
        if t.starts_with('$') {
            return parse_operand(t).map_err(|e| line.err(arg.col, isa_error(&e)));
        }
        if let Some(inner) = t.strip_prefix('[') {
            let close = inner
                .find(']')
                .ok_or_else(|| line.err(arg.col, "memory operand needs `]`"))?;
            let inside = &inner[..close];
            let after = inner[close + 1..].trim();
            let split = inside.find(['+', '-']).unwrap_or(inside.len());
            let base = match parse_operand(inside[..split].trim()) {
                Ok(Operand::M(m)) => m,
                Ok(_) => return Err(line.err(arg.col + 1, "memory base must be an $m register")),
                Err(e) => return Err(line.err(arg.col + 1, isa_error(&e))),
            };
            let sub = |text: &str, at: usize| Piece {
                text: text.to_string(),
                col: arg.col + 1 + at as u32,
            };
            let mut mode = MemMode::Offset(0);
            if split < inside.len() {
                let off = inside[split + 1..].trim_start();
                if off.starts_with('$') {
                    if inside[split..].starts_with('-') {
                        return Err(line.err(arg.col, "a register index cannot be negated"));
                    }
                    match parse_operand(off.trim()) {
                        Ok(Operand::M(m)) => mode = MemMode::Indexed(m),
                        _ => {
                            return Err(
                                line.err(arg.col, format!("bad index register `{}`", off.trim()))
                            )
                        }
                    }
                } else {
                    // Evaluate the signed offset as a whole, e.g. `-4*K`.
                    let v = self.const_expr(line, &sub(&inside[split..], split))?;
                    mode = MemMode::Offset(v);
                }
            }
            if !after.is_empty() {
                let inc = after
                    .strip_prefix("+=")
                    .ok_or_else(|| line.err(arg.col, "expected `+=` after `]`"))?
                    .trim();
                if mode != MemMode::Offset(0) {
                    return Err(line.err(arg.col, "post-increment needs a plain `[$mB]` base"));
                }
                mode = if inc.starts_with('$') {
                    match parse_operand(inc) {
                        Ok(Operand::M(m)) => MemMode::PostIncReg(m),
                        _ => {
                            return Err(line.err(arg.col, format!("bad increment register `{inc}`")))
                        }
                    }
                } else {
                    let at = t.len() - inc.len() - 1;
                    MemMode::PostInc(self.const_expr(line, &sub(inc, at))?)
                };
            }
            return Ok(Operand::Mem { base, mode });
        }
        Ok(match self.eval(line, arg)? {
            Value::Const(v) => Operand::Imm(v),
            Value::Sym { name, addend } => Operand::Symbol { name, addend },
        })
    }

    fn instruction(
        &self,
        line: &Line,
        op: &Piece,
        rest: &Piece,
    ) -> Result<(ipu_isa::Instruction, Option<ipu_isa::Fixup>), AsmError> {
        let args = syntax::split_args(rest);
        let ops = args
            .iter()
            .map(|a| self.operand(line, a))
            .collect::<Result<Vec<_>, _>>()?;
        let a =
            assemble_instruction(&op.text, &ops).map_err(|e| line.err(op.col, isa_error(&e)))?;
        Ok((a.instruction, a.fixup))
    }

    fn bundle(&mut self, line: &Line, rest: &Piece) -> Result<(), AsmError> {
        let t = rest.text.as_str();
        let inner = t
            .strip_prefix('{')
            .and_then(|s| s.trim_end().strip_suffix('}'))
            .ok_or_else(|| {
                line.err(
                    rest.col,
                    "a bundle is `{ main ; arith }` and must end with `}`",
                )
            })?;
        let semi = inner.find(';').ok_or_else(|| {
            line.err(rest.col, "a bundle needs two instructions separated by `;`")
        })?;
        let part = |s: usize, e: usize| -> Result<(Piece, Piece), AsmError> {
            let raw = &inner[s..e];
            let lead = raw.len() - raw.trim_start().len();
            let body = raw.trim();
            let col = rest.col + 1 + (s + lead) as u32;
            if body.is_empty() {
                return Err(line.err(col, "empty instruction in bundle"));
            }
            let end = body.find(char::is_whitespace).unwrap_or(body.len());
            let after = body[end..].trim_start();
            Ok((
                Piece {
                    text: body[..end].to_string(),
                    col,
                },
                Piece {
                    text: after.to_string(),
                    col: col + (body.len() - after.len()) as u32,
                },
            ))
        };
        let (m_op, m_rest) = part(0, semi)?;
        let (a_op, a_rest) = part(semi + 1, inner.len())?;
        let (main, mf) = self.instruction(line, &m_op, &m_rest)?;
        let (arith, af) = self.instruction(line, &a_op, &a_rest)?;
        self.emit_bundle(line, rest.col, Bundle::Pair { main, arith }, [mf, af])
    }

    fn emit_bundle(
        &mut self,
        line: &Line,
        col: u32,
        bundle: Bundle,
        fixups: [Option<ipu_isa::Fixup>; 2],
    ) -> Result<(), AsmError> {
        let words = encode_bundle(&bundle).map_err(|e| line.err(col, isa_error(&e)))?;
        for i in bundle.instructions() {
            self.m_mask |= i.m_reads() | i.m_writes();
            self.a_mask |= i.a_reads() | i.a_writes();
        }
        let s = self.section_mut();
        if s.kind != SectionKind::Code {
            let (name, kind) = (s.name.clone(), s.kind);
            return Err(line.err(
                col,
                format!("instructions belong in a code section; `{name}` is {kind}"),
            ));
        }
        let offset = s.bytes.len() as u32;
        for w in &words {
            s.bytes.extend_from_slice(&w.to_le_bytes());
        }
        self.check_size(line, col)?;
        let section = self.current.expect("set by section_mut");
        self.bundle_lines.push((section, offset, line.clone(), col));
        for (k, f) in fixups.into_iter().enumerate() {
            if let Some(f) = f {
                self.fixups.push(PendingFixup {
                    section,
                    offset: offset + 4 * k as u32,
                    kind: f.kind,
                    symbol: f.symbol,
                    addend: f.addend,
                    line: line.clone(),
                    col,
                });
            }
        }
        Ok(())
    }

    fn check_size(&self, line: &Line, col: u32) -> Result<(), AsmError> {
        let s = &self.sections[self.current.expect("current section")];
        if s.size() > TILE_SRAM_BYTES {
            return Err(line.err(
                col,
                format!(
                    "section `{}` grows past tile memory ({TILE_SRAM_BYTES} bytes)",
                    s.name
                ),
            ));
        }
        Ok(())
    }

    fn data_section(&mut self, line: &Line, op: &Piece) -> Result<usize, AsmError> {
        let s = self.section_mut();
        match s.kind {
            SectionKind::Data => Ok(self.current.expect("set")),
            SectionKind::Code => Err(line.err(
                op.col,
                format!(
                    "`{}` puts data in code section `{}`; code sections hold bundles only",
                    op.text, s.name
                ),
            )),
            SectionKind::Bss => Err(line.err(
                op.col,
                format!(
                    "`{}` puts initialised data in bss section `{}`; use .space or .zero",
                    op.text, s.name
                ),
            )),
        }
    }

    fn directive(&mut self, line: &Line, op: &Piece, rest: &Piece) -> Result<(), AsmError> {
        let args = syntax::split_args(rest);
        let want = |n: usize, what: &str| -> Result<(), AsmError> {
            if args.len() != n {
                return Err(line.err(op.col, format!("`{}` expects {what}", op.text)));
            }
            Ok(())
        };
        let name_arg = |a: &Piece| -> Result<String, AsmError> {
            if syntax::is_identifier(&a.text) {
                Ok(a.text.clone())
            } else {
                Err(line.err(a.col, format!("expected a name, found `{}`", a.text)))
            }
        };
        match op.text.as_str() {
            ".text" => {
                want(0, "no arguments")?;
                self.switch_section(".text", SectionKind::Code, RegionConstraint::Standard);
            }
            ".data" => {
                want(0, "no arguments")?;
                self.switch_section(".data", SectionKind::Data, RegionConstraint::Any);
            }
            ".bss" => {
                want(0, "no arguments")?;
                self.switch_section(".bss", SectionKind::Bss, RegionConstraint::Any);
            }
            ".section" => self.section_directive(line, op, &args)?,
            ".globl" | ".global" | ".entry" => {
                if args.is_empty() {
                    return Err(line.err(op.col, format!("`{}` expects symbol names", op.text)));
                }
                for a in &args {
                    let n = name_arg(a)?;
                    if self.constants.contains_key(&n) {
                        return Err(line.err(a.col, format!("`{n}` is a constant, not a symbol")));
                    }
                    self.globals.insert(n.clone());
                    if op.text == ".entry" && !self.entries.contains(&n) {
                        self.entries.push(n);
                    }
                }
            }
            ".align" | ".balign" => {
                want(1, "one alignment in bytes")?;
                let a = self.const_expr(line, &args[0])?;
                if !(1..=65536).contains(&a) || (a as u64).count_ones() != 1 {
                    return Err(line.err(
                        args[0].col,
                        format!("alignment {a} is not a power of two up to 65536"),
                    ));
                }
                let a = a as u32;
                let nop = ipu_isa::encode_word(&ipu_isa::Instruction::Nop).expect("nop encodes");
                let s = self.section_mut();
                s.align = s.align.max(a);
                match s.kind {
                    SectionKind::Code => {
                        while !(s.bytes.len() as u32).is_multiple_of(a) {
                            s.bytes.extend_from_slice(&nop.to_le_bytes());
                        }
                    }
                    SectionKind::Data => {
                        while !(s.bytes.len() as u32).is_multiple_of(a) {
                            s.bytes.push(0);
                        }
                    }
                    SectionKind::Bss => s.bss_size = s.bss_size.div_ceil(a) * a,
                }
                self.check_size(line, op.col)?;
            }
            ".byte" | ".half" | ".short" | ".word" | ".long" => {
                if args.is_empty() {
                    return Err(line.err(op.col, format!("`{}` expects values", op.text)));
                }
                let si = self.data_section(line, op)?;
                let (width, lo, hi): (usize, i64, i64) = match op.text.as_str() {
                    ".byte" => (1, -128, 255),
                    ".half" | ".short" => (2, -32768, 65535),
                    _ => (4, i32::MIN as i64, u32::MAX as i64),
                };
                for a in &args {
                    let v = self.eval(line, a)?;
                    let offset = self.sections[si].bytes.len() as u32;
                    let value = match v {
                        Value::Const(v) => {
                            if !(lo..=hi).contains(&v) {
                                return Err(line.err(
                                    a.col,
                                    format!("value {v} does not fit `{}` ({lo}..={hi})", op.text),
                                ));
                            }
                            v
                        }
                        Value::Sym { name, addend } => {
                            if width != 4 {
                                return Err(line.err(
                                    a.col,
                                    format!("`{name}` is a symbol; only .word holds addresses"),
                                ));
                            }
                            if !offset.is_multiple_of(4) {
                                return Err(line.err(a.col, format!("a .word holding `{name}` must be 4-byte aligned (offset {offset:#x}); add .align 4")));
                            }
                            self.fixups.push(PendingFixup {
                                section: si,
                                offset,
                                kind: RelocKind::Abs32,
                                symbol: name,
                                addend,
                                line: line.clone(),
                                col: a.col,
                            });
                            0
                        }
                    };
                    self.sections[si]
                        .bytes
                        .extend_from_slice(&value.to_le_bytes()[..width]);
                }
                self.check_size(line, op.col)?;
            }
            ".float" | ".f16" => {
                if args.is_empty() {
                    return Err(line.err(op.col, format!("`{}` expects values", op.text)));
                }
                let si = self.data_section(line, op)?;
                for a in &args {
                    let v: f32 = match a.text.parse::<f32>() {
                        Ok(v) => v,
                        Err(_) => self
                            .const_expr(line, a)
                            .map_err(|_| line.err(a.col, format!("`{}` is not a number", a.text)))?
                            as f32,
                    };
                    if op.text == ".float" {
                        self.sections[si]
                            .bytes
                            .extend_from_slice(&v.to_bits().to_le_bytes());
                    } else {
                        let h = ipu_isa::numerics::f32_to_f16_bits(v);
                        self.sections[si].bytes.extend_from_slice(&h.to_le_bytes());
                    }
                }
                self.check_size(line, op.col)?;
            }
            ".space" | ".zero" | ".skip" => {
                if args.is_empty() || args.len() > 2 {
                    return Err(line.err(
                        op.col,
                        format!("`{}` expects a size and an optional fill byte", op.text),
                    ));
                }
                let n = self.const_expr(line, &args[0])?;
                if !(0..=TILE_SRAM_BYTES as i64).contains(&n) {
                    return Err(line.err(
                        args[0].col,
                        format!("size {n} outside 0..={TILE_SRAM_BYTES}"),
                    ));
                }
                let fill = match args.get(1) {
                    Some(f) => {
                        let v = self.const_expr(line, f)?;
                        if !(-128..=255).contains(&v) {
                            return Err(line.err(f.col, format!("fill {v} is not a byte")));
                        }
                        v as u8
                    }
                    None => 0,
                };
                let s = self.section_mut();
                match s.kind {
                    SectionKind::Code => {
                        let name = s.name.clone();
                        return Err(line.err(op.col, format!("`{}` in code section `{name}`; code sections hold bundles only (use .align to pad with nops)", op.text)));
                    }
                    SectionKind::Bss => {
                        if fill != 0 {
                            return Err(line.err(op.col, "bss can only be zero-filled"));
                        }
                        s.bss_size = s.bss_size.saturating_add(n as u32);
                    }
                    SectionKind::Data => s.bytes.resize(s.bytes.len() + n as usize, fill),
                }
                self.check_size(line, op.col)?;
            }
            ".equ" | ".set" => {
                want(2, "a name and a constant expression")?;
                let n = name_arg(&args[0])?;
                let v = self.const_expr(line, &args[1])?;
                if self.labels.contains_key(&n) {
                    return Err(line.err(args[0].col, format!("`{n}` is already a label")));
                }
                match self.constants.get(&n) {
                    Some((_, true)) if op.text == ".set" => {}
                    Some(_) if self.opts.defines.contains_key(&n) => {
                        return Err(line.err(args[0].col, format!("`{n}` is already defined (by -D on the command line)")))
                    }
                    Some(_) => {
                        return Err(line.err(args[0].col, format!("constant `{n}` is already defined (use .set to redefine a .set constant)")))
                    }
                    None => {}
                }
                self.constants.insert(n, (v, op.text == ".set"));
            }
            ".include" => self.include(line, op.col, &args)?,
            ".kernel" => {
                want(1, "a kernel name")?;
                self.kernel = Some(name_arg(&args[0])?);
            }
            ".param" => {
                if args.is_empty() || args.len() > 2 {
                    return Err(line.err(op.col, "`.param` expects a name and an optional default"));
                }
                let n = name_arg(&args[0])?;
                self.declared_params.insert(n.clone());
                if self.opts.defines.contains_key(&n) {
                    return Ok(());
                }
                if self.constants.contains_key(&n) {
                    return Err(
                        line.err(args[0].col, format!("parameter `{n}` is already defined"))
                    );
                }
                let Some(d) = args.get(1) else {
                    return Err(line.err(
                        args[0].col,
                        format!("parameter `{n}` has no default: pass -D {n}=VALUE"),
                    ));
                };
                let v = self.const_expr(line, d)?;
                self.constants.insert(n.clone(), (v, false));
                self.params.insert(n, v);
            }
            ".workers" => {
                want(1, "a worker count")?;
                let v = self.const_expr(line, &args[0])?;
                if !(1..=WORKER_CONTEXTS as i64).contains(&v) {
                    return Err(line.err(
                        args[0].col,
                        format!("worker count {v} outside 1..={WORKER_CONTEXTS}"),
                    ));
                }
                self.workers = Some(v as u32);
            }
            ".cycles" => {
                want(1, "a formula in quotes")?;
                let f =
                    syntax::string_literal(&args[0].text).map_err(|m| line.err(args[0].col, m))?;
                self.cycles = Some(f);
            }
            ".size" => {
                want(2, "a symbol and a size")?;
                let n = name_arg(&args[0])?;
                let v = self.const_expr(line, &args[1])?;
                if !(0..=TILE_SRAM_BYTES as i64).contains(&v) {
                    return Err(line.err(
                        args[1].col,
                        format!("size {v} outside 0..={TILE_SRAM_BYTES}"),
                    ));
                }
                self.sizes.insert(n, v as u32);
            }
            ".error" => {
                let msg = match args.first() {
                    Some(a) => syntax::string_literal(&a.text).map_err(|m| line.err(a.col, m))?,
                    None => "`.error` directive".to_string(),
                };
                return Err(line.err(op.col, msg));
            }
            other => return Err(line.err(op.col, format!("unknown directive `{other}`"))),
        }
        Ok(())
    }

    fn section_directive(
        &mut self,
        line: &Line,
        op: &Piece,
        args: &[Piece],
    ) -> Result<(), AsmError> {
        let Some(name) = args.first() else {
            return Err(line.err(op.col, "`.section` expects a name"));
        };
        let n = name.text.clone();
        if !syntax::is_identifier(&n) {
            return Err(line.err(name.col, format!("bad section name `{n}`")));
        }
        let mut kind = None;
        let mut region = None;
        for a in &args[1..] {
            match a.text.as_str() {
                "code" => kind = Some(SectionKind::Code),
                "data" => kind = Some(SectionKind::Data),
                "bss" => kind = Some(SectionKind::Bss),
                "region=0" => region = Some(RegionConstraint::Standard),
                "region=1" => region = Some(RegionConstraint::Interleaved),
                other => {
                    return Err(line.err(a.col, format!("unknown section attribute `{other}` (expected code, data, bss, region=0 or region=1)")))
                }
            }
        }
        let kind = match kind {
            Some(k) => k,
            None if n.starts_with(".text") => SectionKind::Code,
            None if n.starts_with(".bss") => SectionKind::Bss,
            None if n.starts_with(".data") || n.starts_with(".rodata") => SectionKind::Data,
            None => match self.sections.iter().find(|s| s.name == n) {
                Some(s) => s.kind,
                None => {
                    return Err(line.err(name.col, format!("cannot tell the kind of section `{n}`; write `.section {n}, code|data|bss`")))
                }
            },
        };
        if kind == SectionKind::Code && region == Some(RegionConstraint::Interleaved) {
            return Err(line.err(name.col, format!("code section `{n}` cannot live in region 1: instructions are fetched from region 0 only")));
        }
        let default_region = if kind == SectionKind::Code {
            RegionConstraint::Standard
        } else {
            RegionConstraint::Any
        };
        if let Some(s) = self.sections.iter().find(|s| s.name == n) {
            if s.kind != kind || region.is_some_and(|r| r != s.region) {
                return Err(line.err(
                    name.col,
                    format!("section `{n}` was opened before as {} {}", s.kind, s.region),
                ));
            }
        }
        self.switch_section(&n, kind, region.unwrap_or(default_region));
        Ok(())
    }

    /// Resolves fixups, checks loops and builds the object and metadata.
    pub(crate) fn finish(mut self, main_name: &str) -> Result<Assembly, AsmError> {
        // Symbols: every label, then undefined references, in a fixed order.
        let mut symbols: Vec<Symbol> = Vec::new();
        let mut order: Vec<(&String, &LabelDef)> = self.labels.iter().collect();
        order.sort_by(|a, b| (a.1.section, a.1.offset, a.0).cmp(&(b.1.section, b.1.offset, b.0)));
        for (name, def) in &order {
            let sec = &self.sections[def.section];
            let global = self.globals.contains(*name);
            let size = match self.sizes.get(*name) {
                Some(s) => *s,
                None if global => {
                    // Up to the next global label of the section, or its end.
                    order
                        .iter()
                        .filter(|(n, d)| {
                            d.section == def.section
                                && d.offset > def.offset
                                && self.globals.contains(*n)
                        })
                        .map(|(_, d)| d.offset)
                        .min()
                        .unwrap_or(sec.size())
                        - def.offset
                }
                None => 0,
            };
            if def.offset as u64 + size as u64 > sec.size() as u64 {
                return Err(AsmError {
                    loc: def.loc.clone(),
                    message: format!("`.size {name}` runs past the end of section `{}`", sec.name),
                    context: vec![],
                });
            }
            symbols.push(Symbol {
                name: (*name).clone(),
                section: Some(def.section as u32),
                offset: def.offset,
                binding: if global {
                    Binding::Global
                } else {
                    Binding::Local
                },
                kind: if sec.kind == SectionKind::Code {
                    SymbolKind::Function
                } else {
                    SymbolKind::Data
                },
                size,
            });
        }
        let mut undefined: BTreeSet<String> =
            self.fixups.iter().map(|f| f.symbol.clone()).collect();
        undefined.extend(self.globals.iter().cloned());
        for n in undefined {
            if !self.labels.contains_key(&n) {
                symbols.push(Symbol {
                    name: n,
                    section: None,
                    offset: 0,
                    binding: Binding::Global,
                    kind: SymbolKind::NoType,
                    size: 0,
                });
            }
        }
        for e in &self.entries {
            if !self.labels.contains_key(e) {
                return Err(AsmError {
                    loc: Loc {
                        file: Rc::from(main_name),
                        line: 0,
                        col: 0,
                    },
                    message: format!("entry `{e}` is never defined"),
                    context: vec![],
                });
            }
        }
        // Fixups: branches within a section are position independent, so
        // they are resolved now; everything else becomes a relocation.
        let mut relocations = Vec::new();
        for f in &self.fixups {
            let local = self
                .labels
                .get(&f.symbol)
                .filter(|d| d.section == f.section && f.kind == RelocKind::PcRel20);
            if let Some(d) = local {
                let bytes = &mut self.sections[f.section].bytes;
                let at = f.offset as usize;
                let word =
                    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
                let patched =
                    ipu_isa::apply_relocation(f.kind, word, f.offset, d.offset as i64 + f.addend)
                        .map_err(|e| {
                        f.line.err(
                            f.col,
                            format!("branch to `{}`: {}", f.symbol, isa_error(&e)),
                        )
                    })?;
                bytes[at..at + 4].copy_from_slice(&patched.to_le_bytes());
            } else {
                let symbol = symbols
                    .iter()
                    .position(|s| s.name == f.symbol)
                    .expect("every fixup symbol is in the table")
                    as u32;
                relocations.push(Relocation {
                    section: f.section as u32,
                    offset: f.offset,
                    kind: f.kind,
                    symbol,
                    addend: f.addend,
                });
            }
        }
        relocations.sort_by_key(|r| (r.section, r.offset));
        self.check_loops()?;
        let sections: Vec<Section> = self
            .sections
            .iter()
            .map(|s| Section {
                name: s.name.clone(),
                kind: s.kind,
                align: s.align,
                region: s.region,
                size: s.size(),
                bytes: if s.kind == SectionKind::Bss {
                    Vec::new()
                } else {
                    s.bytes.clone()
                },
            })
            .collect();
        let object = Object {
            sections,
            symbols,
            relocations,
        };
        object.validate().map_err(|e| AsmError {
            loc: Loc {
                file: Rc::from(main_name),
                line: 0,
                col: 0,
            },
            message: format!("internal error: the assembler built an invalid object: {e}"),
            context: vec![],
        })?;
        let total = |k: SectionKind| {
            object
                .sections
                .iter()
                .filter(|s| s.kind == k)
                .map(|s| s.size)
                .sum::<u32>()
        };
        let entries = if self.entries.is_empty() {
            object
                .symbols
                .iter()
                .filter(|s| s.binding == Binding::Global && s.kind == SymbolKind::Function)
                .map(|s| s.name.clone())
                .collect()
        } else {
            self.entries.clone()
        };
        let digest = crate::source_digest(
            &self
                .files
                .iter()
                .map(|(_, b)| b.as_slice())
                .collect::<Vec<_>>(),
        );
        let stem = Path::new(main_name)
            .file_stem()
            .map_or("kernel".to_string(), |s| s.to_string_lossy().into_owned());
        let metadata = KernelMetadata {
            kernel: self
                .opts
                .name
                .clone()
                .or(self.kernel.clone())
                .unwrap_or(stem),
            target: self.opts.target.clone(),
            entries,
            // Only declared parameters: a -D the source never declares is
            // a plain constant, and listing it would let a request for a
            // specialisation the source lacks match its default code.
            parameters: self
                .params
                .iter()
                .filter(|(k, _)| self.declared_params.contains(*k))
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            code_bytes: total(SectionKind::Code),
            data_bytes: total(SectionKind::Data),
            bss_bytes: total(SectionKind::Bss),
            workers: self.workers,
            registers: RegistersUsed::from_masks(self.m_mask, self.a_mask),
            cycles: self.cycles.clone(),
            source_digest: digest,
            toolchain_version: TOOLCHAIN_VERSION.to_string(),
        };
        Ok(Assembly {
            object,
            metadata,
            files: self.files.iter().map(|(p, _)| p.clone()).collect(),
        })
    }

    /// Hardware loops: the `len` bundles after a `rpt` must exist in the
    /// same section and contain no control instruction.
    fn check_loops(&self) -> Result<(), AsmError> {
        for (si, s) in self.sections.iter().enumerate() {
            if s.kind != SectionKind::Code {
                continue;
            }
            let lines: Vec<&(usize, u32, Line, u32)> =
                self.bundle_lines.iter().filter(|b| b.0 == si).collect();
            let mut bundles = Vec::new();
            let mut off = 0usize;
            while off < s.bytes.len() {
                let (b, n) = decode_bundle_bytes(&s.bytes[off..]).map_err(|e| AsmError {
                    loc: Loc {
                        file: Rc::from(s.name.as_str()),
                        line: 0,
                        col: 0,
                    },
                    message: format!("internal error: code at {off:#x} does not decode: {e}"),
                    context: vec![],
                })?;
                bundles.push((off as u32, b));
                off += n;
            }
            for (k, (off, b)) in bundles.iter().enumerate() {
                let len = match b {
                    Bundle::Single(ipu_isa::Instruction::Rpt { len, .. })
                    | Bundle::Single(ipu_isa::Instruction::RptImm { len, .. }) => *len as usize,
                    _ => continue,
                };
                let at = lines.iter().find(|l| l.1 == *off);
                let err = |m: String| match at {
                    Some((_, _, line, col)) => line.err(*col, m),
                    None => AsmError {
                        loc: Loc {
                            file: Rc::from(s.name.as_str()),
                            line: 0,
                            col: 0,
                        },
                        message: m,
                        context: vec![],
                    },
                };
                if k + len >= bundles.len() {
                    return Err(err(format!(
                        "`{b}`: the loop body of {len} bundles runs past the end of section `{}`",
                        s.name
                    )));
                }
                for (j, (_, body)) in bundles[k + 1..=k + len].iter().enumerate() {
                    if let Some(c) = body.instructions().find(|i| i.is_control()) {
                        return Err(err(format!("`{b}`: bundle {} of the loop body is the control instruction `{c}`; hardware loop bodies cannot contain control", j + 1)));
                    }
                }
            }
        }
        Ok(())
    }
}
