//! Parser of the IR text format: reads exactly what [`crate::print::print`] and
//! [`crate::print::print_with_locs`] write, so `print(&parse(&print(f))?) ==
//! print(f)` for every valid function, locations included.
//!
//! The grammar is line-oriented (the `lexer` submodule makes the tokens):
//!
//! ```text
//! kernel  := 'kernel' @name '(' (param (',' param)*)? ')' '{' loc? NL body '}' NL* EOF
//! param   := %name ':' type ('{' 'divisibility' '=' int '}')?
//! body    := (NL | op)*                          -- up to the closing `}`
//! op      := (%r (',' %r)* '=')? mnemonic (%a (',' %a)*)? attrs? (':' type (',' type)*)?
//!            loc? ('{' NL region '}')* loc? NL     -- at most one loc, printed last
//! region  := ('^' '(' (%a ':' type (',' ...)*)? ')' ':' NL)? body
//! attrs   := '{' (key ('=' value)? (',' ...)*)? '}'  -- on one line; a region's `{` ends its line
//! value   := int | float | '-inf' | '[' ints ']' | word | "string"
//! loc     := 'loc' '(' "file" ':' line ':' col ')'
//! ```
//!
//! Invariants: every error is [`Error::Parse`] with the 1-based line and column
//! (in characters) of the offending token; no input panics. Names are unique
//! in a function and visible from their definition to the end of the region
//! that defines them; an op's results are visible only after the op (not in its
//! own regions). Attributes must be ones the op prints (defaults are written by
//! omission), and the finished function must pass [`crate::verify`]: its
//! findings are reported as parse errors at the offending op.

mod lexer;

use crate::dtype::{DType, Elem, Shape, Type};
use crate::error::{Error, Result};
use crate::ir::ops::Attr;
use crate::ir::{Block, Function, Inst, Op, ParamHints, Region, Scalar, Value};
use crate::loc::Location;
use lexer::{Tok, Token};
use rustc_hash::FxHashMap;

/// Parses one kernel from its text form (see the module docs for the grammar).
///
/// Errors: [`Error::Parse`] with the line and column of the first problem, be it
/// lexical, syntactic (unknown op, bad type or attribute, undefined or redefined
/// value, unclosed region) or a verifier finding on the parsed function.
pub fn parse(text: &str) -> Result<Function> {
    let mut p = Parser {
        toks: lexer::lex(text),
        pos: 0,
        names: FxHashMap::default(),
        scopes: vec![Vec::new()],
        inst_pos: Vec::new(),
    };
    let (f, header) = p.kernel()?;
    p.verify(f, header)
}

/// Deepest region nesting accepted (keeps recursion bounded on hostile input).
const MAX_DEPTH: usize = 128;

/// Largest tile accepted, in elements (keeps shape arithmetic far from overflow).
const MAX_NUMEL: u64 = 1 << 32;

/// The file name of the text positions given to the verifier (see `verify`).
const TEXT_POS: &str = "<ir text position>";

/// A 1-based text position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pos {
    line: usize,
    col: usize,
}

fn err(at: Pos, message: impl Into<String>) -> Error {
    Error::Parse { line: at.line, col: at.col, message: message.into() }
}

/// A value name seen so far.
struct Name {
    /// The value; `None` while the op defining it is being parsed.
    value: Option<Value>,
    /// Where it is defined.
    at: Pos,
    /// False once the region that defines it has ended.
    visible: bool,
}

/// One parsed attribute and where its name and value start.
struct ParsedAttr {
    key: String,
    attr: Attr,
    at: Pos,
    value_at: Pos,
}

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    /// Every name defined in the function (names are unique in a function).
    names: FxHashMap<String, Name>,
    /// Names defined in each open region, innermost last.
    scopes: Vec<Vec<String>>,
    /// Where each op's mnemonic is, for verifier findings.
    inst_pos: Vec<(Inst, Pos)>,
}

impl Parser {
    // ---- token access -------------------------------------------------------

    /// The token `n` ahead (the last token, `Eof` or `Error`, repeats forever).
    fn tok_at(&self, n: usize) -> &Token {
        let i = (self.pos + n).min(self.toks.len().saturating_sub(1));
        &self.toks[i]
    }

    /// The next token; a lexical error surfaces here, in text order.
    fn peek(&self) -> Result<&Token> {
        let t = self.tok_at(0);
        match &t.tok {
            Tok::Error(m) => Err(err(Self::at(t), m.clone())),
            _ => Ok(t),
        }
    }

    fn peek_tok(&self) -> Result<&Tok> {
        Ok(&self.peek()?.tok)
    }

    fn at(t: &Token) -> Pos {
        Pos { line: t.line, col: t.col }
    }

    /// Where the next token starts.
    fn here(&self) -> Pos {
        Self::at(self.tok_at(0))
    }

    fn bump(&mut self) -> Result<Token> {
        let t = self.peek()?.clone();
        if self.pos < self.toks.len() {
            self.pos += 1;
        }
        Ok(t)
    }

    /// An error "expected `what`, found ..." at the next token.
    fn expected<T>(&self, what: &str) -> Result<T> {
        let t = self.peek()?;
        Err(err(Self::at(t), format!("expected {what}, found {}", t.tok.describe())))
    }

    fn is_punct(&self, c: char) -> Result<bool> {
        Ok(self.peek_tok()? == &Tok::Punct(c))
    }

    fn eat_punct(&mut self, c: char) -> Result<bool> {
        if self.is_punct(c)? {
            self.bump()?;
            return Ok(true);
        }
        Ok(false)
    }

    fn expect_punct(&mut self, c: char, what: &str) -> Result<Pos> {
        if self.is_punct(c)? {
            return Ok(Self::at(&self.bump()?));
        }
        self.expected(what)
    }

    fn expect_newline(&mut self, what: &str) -> Result<()> {
        if self.peek_tok()? == &Tok::Newline {
            self.bump()?;
            return Ok(());
        }
        self.expected(what)
    }

    fn skip_newlines(&mut self) -> Result<()> {
        while self.peek_tok()? == &Tok::Newline {
            self.bump()?;
        }
        Ok(())
    }

    /// A `%name` token.
    fn value_name(&mut self, what: &str) -> Result<(String, Pos)> {
        if let Tok::Value(n) = self.peek_tok()? {
            let n = n.clone();
            return Ok((n, Self::at(&self.bump()?)));
        }
        self.expected(what)
    }

    fn int(&mut self, what: &str) -> Result<(i64, Pos)> {
        if let Tok::Int(i) = *self.peek_tok()? {
            return Ok((i, Self::at(&self.bump()?)));
        }
        self.expected(what)
    }

    // ---- names --------------------------------------------------------------

    /// Claims `name` for a definition at `at`; the value is set by `define`.
    fn reserve(&mut self, name: &str, at: Pos) -> Result<()> {
        if let Some(prev) = self.names.get(name) {
            return Err(err(
                at,
                format!(
                    "value `%{name}` is already defined at line {}, column {}",
                    prev.at.line, prev.at.col
                ),
            ));
        }
        self.names.insert(name.to_string(), Name { value: None, at, visible: false });
        Ok(())
    }

    /// Makes a reserved name refer to `v` from here to the end of the current region.
    fn define(&mut self, name: &str, v: Value) {
        if let Some(n) = self.names.get_mut(name) {
            n.value = Some(v);
            n.visible = true;
        }
        if let Some(scope) = self.scopes.last_mut() {
            scope.push(name.to_string());
        }
    }

    fn lookup(&self, name: &str, at: Pos) -> Result<Value> {
        match self.names.get(name) {
            None => Err(err(at, format!("use of undefined value `%{name}`"))),
            Some(Name { value: None, .. }) => {
                Err(err(at, format!("value `%{name}` is used by the op that defines it")))
            }
            Some(Name { value: Some(v), visible: true, .. }) => Ok(*v),
            Some(Name { at: def, .. }) => Err(err(
                at,
                format!(
                    "value `%{name}` (defined at line {}, column {}) is not visible here: \
                     the region that defines it has ended",
                    def.line, def.col
                ),
            )),
        }
    }

    fn enter_scope(&mut self) {
        self.scopes.push(Vec::new());
    }

    fn exit_scope(&mut self) {
        for name in self.scopes.pop().unwrap_or_default() {
            if let Some(n) = self.names.get_mut(&name) {
                n.visible = false;
            }
        }
    }

    // ---- kernel -------------------------------------------------------------

    /// The whole text; returns the function and the kernel header's position.
    fn kernel(&mut self) -> Result<(Function, Pos)> {
        self.skip_newlines()?;
        let header = self.here();
        match self.peek_tok()? {
            Tok::Ident(k) if k == "kernel" => {
                self.bump()?;
            }
            _ => return self.expected("`kernel`"),
        }
        let name = match self.peek_tok()? {
            Tok::Global(n) => n.clone(),
            _ => return self.expected("the kernel name `@name`"),
        };
        self.bump()?;
        let mut f = Function::new(name, Location::unknown());
        self.expect_punct('(', "`(` before the parameters")?;
        if !self.eat_punct(')')? {
            loop {
                self.param(&mut f)?;
                if !self.eat_punct(',')? {
                    self.expect_punct(')', "`,` or `)` after a parameter")?;
                    break;
                }
            }
        }
        let open = self.expect_punct('{', "`{` opening the kernel body")?;
        if let Some(loc) = self.opt_loc()? {
            f.loc = loc;
        }
        self.expect_newline("the end of the line after the kernel header")?;
        let body = f.body_block();
        self.body(&mut f, body, 0, open, "the kernel body")?;
        self.expect_punct('}', "`}` closing the kernel body")?;
        self.skip_newlines()?;
        if self.peek_tok()? != &Tok::Eof {
            return self.expected("the end of the input after the kernel");
        }
        Ok((f, header))
    }

    /// `%name: type {divisibility = n}`.
    fn param(&mut self, f: &mut Function) -> Result<()> {
        let (name, at) = self.value_name("a parameter `%name`")?;
        self.reserve(&name, at)?;
        self.expect_punct(':', "`:` and the parameter's type")?;
        let ty = self.ty()?;
        let mut hints = ParamHints::default();
        if self.is_punct('{')? {
            for a in self.attr_dict()? {
                match (a.key.as_str(), &a.attr) {
                    ("divisibility", Attr::Int(d)) => {
                        let d = u32::try_from(*d).map_err(|_| {
                            err(a.value_at, format!("divisibility {d} is out of range for u32"))
                        })?;
                        hints.divisibility = Some(d);
                    }
                    ("divisibility", _) => return Err(err(a.value_at, "divisibility must be an integer")),
                    (k, _) => {
                        return Err(err(
                            a.at,
                            format!("unknown parameter hint `{k}` (expected `divisibility`)"),
                        ));
                    }
                }
            }
        }
        let v = f.add_param(name.clone(), ty, hints);
        self.define(&name, v);
        Ok(())
    }

    // ---- blocks and ops -----------------------------------------------------

    /// Ops up to (not including) the `}` closing the block opened at `open`.
    fn body(&mut self, f: &mut Function, b: Block, depth: usize, open: Pos, what: &str) -> Result<()> {
        loop {
            match self.peek_tok()? {
                Tok::Newline => {
                    self.bump()?;
                }
                Tok::Punct('}') => return Ok(()),
                Tok::Eof => {
                    return Err(err(
                        self.here(),
                        format!(
                            "unexpected end of input: {what} opened at line {}, column {} is not closed with `}}`",
                            open.line, open.col
                        ),
                    ));
                }
                _ => self.op(f, b, depth)?,
            }
        }
    }

    /// One op line (with its regions) appended to `b`.
    fn op(&mut self, f: &mut Function, b: Block, depth: usize) -> Result<()> {
        let mut results = Vec::new();
        if matches!(self.peek_tok()?, Tok::Value(_)) {
            loop {
                let (name, at) = self.value_name("a result name")?;
                self.reserve(&name, at)?;
                results.push(name);
                if !self.eat_punct(',')? {
                    break;
                }
            }
            self.expect_punct('=', "`=` after the result names")?;
        }
        let (mnemonic, op_at) = match self.peek_tok()? {
            Tok::Ident(n) => (n.clone(), self.here()),
            _ => return self.expected("an op name"),
        };
        self.bump()?;

        let mut args = Vec::new();
        if matches!(self.peek_tok()?, Tok::Value(_)) {
            loop {
                let (name, at) = self.value_name("an operand")?;
                args.push(self.lookup(&name, at)?);
                if !self.eat_punct(',')? {
                    break;
                }
            }
        }
        // `{` ending the line opens a region; on the same line it opens attributes.
        let attrs = if self.is_punct('{')? && self.tok_at(1).tok != Tok::Newline {
            self.attr_dict()?
        } else {
            Vec::new()
        };
        let mut types = Vec::new();
        let types_at = self.here();
        if self.eat_punct(':')? {
            loop {
                types.push(self.ty()?);
                if !self.eat_punct(',')? {
                    break;
                }
            }
        }
        if types.len() != results.len() {
            let at = if types.is_empty() { self.here() } else { types_at };
            return Err(err(
                at,
                format!(
                    "`{mnemonic}` has {} result name(s) but {} result type(s) (write ` : type, ...` after the attributes)",
                    results.len(),
                    types.len()
                ),
            ));
        }

        if self.is_punct('{')? && self.tok_at(1).tok != Tok::Newline {
            return Err(err(
                Self::at(self.tok_at(1)),
                "expected the end of the line after `{` (a region's ops start on the next line; \
                 attributes go before ` : `)",
            ));
        }
        let op = self.build_op(&mnemonic, op_at, &attrs, &types)?;
        let inst = f.create_inst(op, &args, types, Location::unknown());
        f.append_inst(b, inst);
        self.inst_pos.push((inst, op_at));

        // The printer writes an op's location after its regions; before them is accepted too.
        let early_loc = self.opt_loc()?;
        while self.is_punct('{')? {
            let open = Self::at(&self.bump()?);
            self.expect_newline("the end of the line after `{` (a region's ops start on the next line; attributes go before ` : `)")?;
            if depth + 1 > MAX_DEPTH {
                return Err(err(open, format!("regions are nested more than {MAX_DEPTH} deep")));
            }
            let r = f.new_region(Some(inst));
            f.insts[inst].regions.push(r);
            self.region(f, r, depth + 1, open)?;
            self.expect_punct('}', "`}` closing the region")?;
        }
        let late_at = self.here();
        match (early_loc, self.opt_loc()?) {
            (Some(_), Some(_)) => return Err(err(late_at, "an op has at most one location")),
            (Some(loc), None) | (None, Some(loc)) => f.insts[inst].loc = loc,
            (None, None) => {}
        }
        if self.peek_tok()? != &Tok::Newline {
            return self.expected("the end of the line after the op");
        }
        self.bump()?;
        let values = f.insts[inst].results.clone();
        for (name, v) in results.iter().zip(values) {
            self.define(name, v);
        }
        Ok(())
    }

    /// A region's optional `^(%a: ty, ...):` header and its ops.
    fn region(&mut self, f: &mut Function, r: Region, depth: usize, open: Pos) -> Result<()> {
        self.enter_scope();
        self.skip_newlines()?;
        let b = f.entry(r);
        if self.eat_punct('^')? {
            self.expect_punct('(', "`(` after `^`")?;
            if !self.eat_punct(')')? {
                loop {
                    let (name, at) = self.value_name("a block argument `%name`")?;
                    self.reserve(&name, at)?;
                    self.expect_punct(':', "`:` and the block argument's type")?;
                    let ty = self.ty()?;
                    let v = f.add_block_arg(b, ty);
                    self.define(&name, v);
                    if !self.eat_punct(',')? {
                        self.expect_punct(')', "`,` or `)` after a block argument")?;
                        break;
                    }
                }
            }
            self.expect_punct(':', "`:` after the block arguments")?;
            self.expect_newline("the end of the line after the block arguments")?;
        }
        self.body(f, b, depth, open, "the region")?;
        self.exit_scope();
        Ok(())
    }

    /// Rebuilds the op and checks its attributes against what it prints.
    fn build_op(&self, mnemonic: &str, op_at: Pos, attrs: &[ParsedAttr], types: &[Type]) -> Result<Op> {
        for a in attrs {
            check_attr_value(a, mnemonic, types)?;
        }
        let plain: Vec<(String, Attr)> = attrs.iter().map(|a| (a.key.clone(), a.attr.clone())).collect();
        let op = match Op::from_parts(mnemonic, &plain, types) {
            Ok(Some(op)) => op,
            Ok(None) => return Err(err(op_at, format!("unknown op `{mnemonic}`"))),
            Err(m) => {
                // Point at the attribute whose name or word value the message quotes, if any.
                let quotes = |a: &ParsedAttr| {
                    m.contains(&format!("`{}`", a.key))
                        || matches!(&a.attr, Attr::Word(w) if m.contains(&format!("`{w}`")))
                };
                let at = attrs.iter().find(|a| quotes(a)).map_or(op_at, |a| a.value_at);
                return Err(err(at, format!("invalid `{mnemonic}`: {m}")));
            }
        };
        let canonical = op.attrs();
        for a in attrs {
            match canonical.iter().find(|(k, _)| *k == a.key) {
                None => {
                    let have: Vec<&str> = canonical.iter().map(|(k, _)| *k).collect();
                    let have = if have.is_empty() { "none".to_string() } else { have.join(", ") };
                    return Err(err(
                        a.at,
                        format!(
                            "unexpected attribute `{}` on `{mnemonic}` (this op prints: {have}; \
                             default values are written by leaving the attribute out)",
                            a.key
                        ),
                    ));
                }
                Some((_, Attr::Flag)) if a.attr != Attr::Flag => {
                    return Err(err(
                        a.value_at,
                        format!("attribute `{}` is a flag and takes no value", a.key),
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(op)
    }

    // ---- attributes, types, locations ----------------------------------------

    /// `{k = v, flag, ...}` on one line.
    fn attr_dict(&mut self) -> Result<Vec<ParsedAttr>> {
        self.expect_punct('{', "`{`")?;
        let mut out: Vec<ParsedAttr> = Vec::new();
        if self.eat_punct('}')? {
            return Ok(out);
        }
        loop {
            let (key, at) = match self.peek_tok()? {
                Tok::Ident(k) => (k.clone(), self.here()),
                _ => return self.expected("an attribute name"),
            };
            self.bump()?;
            if out.iter().any(|a| a.key == key) {
                return Err(err(at, format!("duplicate attribute `{key}`")));
            }
            let (attr, value_at) = if self.eat_punct('=')? {
                let value_at = self.here();
                (self.attr_value(&key)?, value_at)
            } else {
                (Attr::Flag, at)
            };
            out.push(ParsedAttr { key, attr, at, value_at });
            if !self.eat_punct(',')? {
                self.expect_punct('}', "`,` or `}` in the attributes")?;
                return Ok(out);
            }
        }
    }

    /// One attribute value; `value` (of `const`/`full`) reads words as constants.
    fn attr_value(&mut self, key: &str) -> Result<Attr> {
        let t = self.peek()?.clone();
        let attr = match &t.tok {
            Tok::Int(i) => Attr::Int(*i),
            Tok::Float(x) => Attr::Const(Scalar::float(DType::F64, *x)),
            Tok::Str(s) => Attr::Str(s.clone()),
            Tok::Ident(w) if key == "value" => match w.as_str() {
                "true" => Attr::Const(Scalar::bool(true)),
                "false" => Attr::Const(Scalar::bool(false)),
                "inf" => Attr::Const(Scalar::float(DType::F64, f64::INFINITY)),
                "nan" => Attr::Const(Scalar::float(DType::F64, f64::NAN)),
                _ => return Err(err(Self::at(&t), format!("expected a number, found `{w}`"))),
            },
            Tok::Ident(w) => Attr::Word(w.clone()),
            Tok::Punct('[') => {
                self.bump()?;
                let mut v = Vec::new();
                if !self.eat_punct(']')? {
                    loop {
                        v.push(self.int("an integer in the list")?.0);
                        if !self.eat_punct(',')? {
                            self.expect_punct(']', "`,` or `]` in the list")?;
                            break;
                        }
                    }
                }
                return Ok(Attr::Ints(v));
            }
            _ => return self.expected("an attribute value"),
        };
        self.bump()?;
        Ok(attr)
    }

    /// A type: a dtype name, `ptr<d>` or `tensor<AxBx...xelem>`.
    fn ty(&mut self) -> Result<Type> {
        let t = self.peek()?.clone();
        let at = Self::at(&t);
        let ty = match &t.tok {
            Tok::Ident(n) => match DType::from_name(n) {
                Some(d) => Type::scalar(d),
                None => return Err(err(at, format!("unknown type `{n}`"))),
            },
            Tok::TypeLit(s) => {
                parse_type_lit(s).map_err(|(off, m)| err(Pos { line: at.line, col: at.col + off }, m))?
            }
            _ => return self.expected("a type"),
        };
        self.bump()?;
        Ok(ty)
    }

    /// An optional `loc("file":line:col)`.
    fn opt_loc(&mut self) -> Result<Option<Location>> {
        match self.peek_tok()? {
            Tok::Ident(w) if w == "loc" => {}
            _ => return Ok(None),
        }
        self.bump()?;
        self.expect_punct('(', "`(` after `loc`")?;
        let file = match self.peek_tok()? {
            Tok::Str(s) => s.clone(),
            _ => return self.expected("the quoted file name of the location"),
        };
        self.bump()?;
        self.expect_punct(':', "`:` after the file name")?;
        let line = self.u32_num("line number")?;
        self.expect_punct(':', "`:` after the line number")?;
        let col = self.u32_num("column number")?;
        self.expect_punct(')', "`)` closing the location")?;
        Ok(Some(Location::new(file, line, col)))
    }

    /// A non-negative integer that fits in `u32`.
    fn u32_num(&mut self, what: &str) -> Result<u32> {
        let (i, at) = self.int(&format!("a {what}"))?;
        u32::try_from(i).map_err(|_| err(at, format!("{i} is not a valid {what}")))
    }

    // ---- verification -------------------------------------------------------

    /// Runs the verifier; a finding becomes a parse error at the op it concerns.
    fn verify(&self, f: Function, header: Pos) -> Result<Function> {
        if crate::verify::verify_collect(&f).is_empty() {
            return Ok(f);
        }
        // Re-run on a copy whose locations are text positions, to place the findings.
        let mut g = f.clone();
        let as_loc = |p: Pos| {
            Location::new(
                TEXT_POS,
                u32::try_from(p.line).unwrap_or(u32::MAX),
                u32::try_from(p.col).unwrap_or(u32::MAX),
            )
        };
        for &(inst, p) in &self.inst_pos {
            g.insts[inst].loc = as_loc(p);
        }
        g.loc = as_loc(header);
        let diags = crate::verify::verify_collect(&g);
        let place = |l: &Location| {
            if l.file == TEXT_POS { Pos { line: l.line as usize, col: l.col as usize } } else { header }
        };
        let describe = |d: &crate::error::Diagnostic| match d.op {
            Some(op) => format!("in `{op}`: {}", d.message),
            None => d.message.clone(),
        };
        let Some(first) = diags.first() else {
            return Ok(f);
        };
        let mut message = format!("invalid IR: {}", describe(first));
        for d in &diags[1..] {
            let p = place(&d.loc);
            message.push_str(&format!("\n  line {}, column {}: {}", p.line, p.col, describe(d)));
        }
        Err(err(place(&first.loc), message))
    }
}

/// Checks an attribute value before the op is built: tile shapes stay small
/// enough for overflow-free arithmetic, and `value` constants fit their dtype.
fn check_attr_value(a: &ParsedAttr, mnemonic: &str, types: &[Type]) -> Result<()> {
    if a.key == "shape"
        && let Attr::Ints(dims) = &a.attr
    {
        let mut n: u64 = 1;
        for &d in dims {
            n = u64::try_from(d).ok().and_then(|d| n.checked_mul(d)).filter(|&n| n <= MAX_NUMEL).ok_or_else(
                || {
                    err(
                        a.value_at,
                        format!("shape {dims:?} is invalid or has more than {MAX_NUMEL} elements"),
                    )
                },
            )?;
        }
    }
    if a.key == "value" && matches!(mnemonic, "const" | "full") {
        let Some(d) = types.first().map(Type::dtype) else {
            return Ok(());
        };
        match &a.attr {
            Attr::Int(i) if d.is_int() && Scalar::int(d, *i).as_i64() != *i => {
                return Err(err(a.value_at, format!("{i} does not fit in {d}")));
            }
            Attr::Int(_) => {}
            Attr::Const(s) if d.is_int() && (s.dtype() != DType::I1 || d != DType::I1) => {
                return Err(err(a.value_at, format!("expected an integer constant for {d}, found `{s}`")));
            }
            Attr::Const(s) if d.is_float() && s.dtype() == DType::I1 => {
                return Err(err(a.value_at, format!("expected a float constant for {d}, found `{s}`")));
            }
            Attr::Const(_) => {}
            _ => return Err(err(a.value_at, "attribute `value` must be a number")),
        }
    }
    Ok(())
}

/// Parses the text of a `ptr<...>` or `tensor<...>` token; errors carry the
/// character offset into the token.
fn parse_type_lit(s: &str) -> std::result::Result<Type, (usize, String)> {
    let chars: Vec<char> = s.chars().collect();
    let elem_at = |from: usize| -> std::result::Result<Elem, (usize, String)> {
        let text: String = chars.get(from..chars.len().saturating_sub(1)).unwrap_or(&[]).iter().collect();
        if let Some(inner) = text.strip_prefix("ptr<").and_then(|t| t.strip_suffix('>')) {
            return DType::from_name(inner)
                .map(Elem::Ptr)
                .ok_or((from + 4, format!("unknown pointee type `{inner}`")));
        }
        DType::from_name(&text).map(Elem::Scalar).ok_or((from, format!("unknown element type `{text}`")))
    };
    if let Some(inner) = s.strip_prefix("ptr<").and_then(|t| t.strip_suffix('>')) {
        return DType::from_name(inner).map(Type::ptr).ok_or((4, format!("unknown pointee type `{inner}`")));
    }
    if !s.starts_with("tensor<") {
        let head: String = chars.iter().take_while(|&&c| c != '<').collect();
        return Err((0, format!("unknown type `{head}<...>` (expected `ptr<...>` or `tensor<...>`)")));
    }
    let mut i = "tensor<".len();
    let mut shape = Shape::new();
    let mut numel: u64 = 1;
    while chars.get(i).is_some_and(|c| c.is_ascii_digit()) {
        let start = i;
        while chars.get(i).is_some_and(|c| c.is_ascii_digit()) {
            i += 1;
        }
        let digits: String = chars[start..i].iter().collect();
        let too_big =
            || (start, format!("dimension {digits} makes the tile larger than {MAX_NUMEL} elements"));
        let d = digits.parse::<u64>().map_err(|_| too_big())?;
        numel = numel.checked_mul(d).filter(|&n| n <= MAX_NUMEL).ok_or_else(too_big)?;
        shape.push(usize::try_from(d).map_err(|_| too_big())?);
        if chars.get(i) != Some(&'x') {
            return Err((i, "expected `x` after a tile dimension".into()));
        }
        i += 1;
    }
    if shape.is_empty() {
        return Err((i, "expected a tile dimension (tensor types are written `tensor<64x32xf32>`)".into()));
    }
    Ok(Type { elem: elem_at(i)?, shape })
}
