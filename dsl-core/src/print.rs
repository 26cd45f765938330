//! The stable text form of the IR (what snapshots pin and the parser reads).
//!
//! ```text
//! kernel @name(%x_ptr: ptr<f32> {divisibility = 16}, %n: i32) {
//!   %0 = program_id {axis = 0} : i32
//!   %1 = arange {start = 0, end = 128} : tensor<128xi32>
//!   %2, %3 = for %a, %b, %c, %init0, %init1 : f32, f32 {
//!   ^(%4: i32, %5: f32, %6: f32):
//!     yield %5, %6
//!   }
//!   store %p, %v, %m {mask}
//! }
//! ```
//!
//! Parameters print by name; other values are numbered `%0, %1, ...` in print
//! order, so the text does not depend on arena indices (passes that delete ops
//! do not leave gaps). Attributes print in a fixed order; defaults are omitted.
//! `print_with_locs` appends `loc("file":line:col)` to every op.

use crate::ir::ops::Attr;
use crate::ir::{Block, Function, Inst, Region, Value};
use rustc_hash::FxHashMap;
use std::fmt::Write;

/// Prints `f` without locations.
pub fn print(f: &Function) -> String {
    Printer::new(f, false).run()
}

/// The names [`print`] gives `f`'s values (`%x_ptr`, `%12`), so that other
/// dumps of the same function (the code generator's plan) can name values
/// as the printed IR does.
pub fn value_names(f: &Function) -> FxHashMap<Value, String> {
    let mut p = Printer::new(f, false);
    p.render();
    p.names
}

/// Prints `f` with a `loc(...)` on every op.
pub fn print_with_locs(f: &Function) -> String {
    Printer::new(f, true).run()
}

impl std::fmt::Display for Function {
    fn fmt(&self, out: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        out.write_str(&print(self))
    }
}

/// Formats one attribute value.
pub fn fmt_attr(a: &Attr) -> String {
    match a {
        Attr::Int(i) => i.to_string(),
        Attr::Ints(v) => {
            let parts: Vec<String> = v.iter().map(|i| i.to_string()).collect();
            format!("[{}]", parts.join(", "))
        }
        Attr::Word(w) => w.clone(),
        Attr::Str(s) => format!("{s:?}"),
        Attr::Const(c) => c.to_string(),
        Attr::Flag => String::new(),
    }
}

struct Printer<'a> {
    f: &'a Function,
    locs: bool,
    names: FxHashMap<Value, String>,
    next: usize,
    out: String,
}

impl<'a> Printer<'a> {
    fn new(f: &'a Function, locs: bool) -> Self {
        Printer { f, locs, names: FxHashMap::default(), next: 0, out: String::new() }
    }

    fn name(&mut self, v: Value) -> String {
        if let Some(n) = self.names.get(&v) {
            return n.clone();
        }
        let n = format!("%{}", self.next);
        self.next += 1;
        self.names.insert(v, n.clone());
        n
    }

    fn use_name(&self, v: Value) -> String {
        // A use of a value never defined in print order is malformed IR; print it
        // recognizably rather than failing (the verifier reports it).
        self.names.get(&v).cloned().unwrap_or_else(|| format!("%<undefined {v}>"))
    }

    fn run(mut self) -> String {
        self.render();
        self.out
    }

    fn render(&mut self) {
        let f = self.f;
        let _ = write!(self.out, "kernel @{}(", f.name);
        for (i, p) in f.params.iter().enumerate() {
            let name = format!("%{}", p.name);
            self.names.insert(p.value, name.clone());
            if i > 0 {
                self.out.push_str(", ");
            }
            let _ = write!(self.out, "{name}: {}", f.ty(p.value));
            if let Some(d) = p.hints.divisibility {
                let _ = write!(self.out, " {{divisibility = {d}}}");
            }
        }
        self.out.push_str(") {");
        if self.locs && !f.loc.is_unknown() {
            let _ = write!(self.out, " loc({:?}:{}:{})", f.loc.file, f.loc.line, f.loc.col);
        }
        self.out.push('\n');
        let body = f.body_block();
        self.block_body(body, 1);
        self.out.push_str("}\n");
    }

    fn block_body(&mut self, b: Block, indent: usize) {
        for &i in &self.f.blocks[b].insts {
            self.inst(i, indent);
        }
    }

    fn inst(&mut self, i: Inst, indent: usize) {
        let f = self.f;
        let data = &f.insts[i];
        let pad = "  ".repeat(indent);
        let mut line = pad.clone();
        // Operands are named before results so that uses print the definition's name.
        let args: Vec<String> = data.args.iter().map(|&a| self.use_name(a)).collect();
        if !data.results.is_empty() {
            let res: Vec<String> = data.results.iter().map(|&r| self.name(r)).collect();
            let _ = write!(line, "{} = ", res.join(", "));
        }
        line.push_str(data.op.name());
        if !args.is_empty() {
            let _ = write!(line, " {}", args.join(", "));
        }
        let attrs = data.op.attrs();
        if !attrs.is_empty() {
            let parts: Vec<String> = attrs
                .iter()
                .map(|(k, v)| match v {
                    Attr::Flag => k.to_string(),
                    v => format!("{k} = {}", fmt_attr(v)),
                })
                .collect();
            let _ = write!(line, " {{{}}}", parts.join(", "));
        }
        if !data.results.is_empty() {
            let tys: Vec<String> = data.results.iter().map(|&r| f.ty(r).to_string()).collect();
            let _ = write!(line, " : {}", tys.join(", "));
        }
        // The location goes on the op's own line, before any regions.
        if self.locs && !data.loc.is_unknown() {
            let _ = write!(line, " loc({:?}:{}:{})", data.loc.file, data.loc.line, data.loc.col);
        }
        for &r in &data.regions {
            line.push_str(" {");
            self.out.push_str(&line);
            self.out.push('\n');
            self.region(r, indent);
            line = format!("{pad}}}");
        }
        self.out.push_str(&line);
        self.out.push('\n');
    }

    fn region(&mut self, r: Region, indent: usize) {
        let b = self.f.entry(r);
        let pad = "  ".repeat(indent);
        if !self.f.blocks[b].args.is_empty() {
            let args: Vec<String> = self.f.blocks[b]
                .args
                .clone()
                .into_iter()
                .map(|a| {
                    let n = self.name(a);
                    format!("{n}: {}", self.f.ty(a))
                })
                .collect();
            let _ = writeln!(self.out, "{pad}^({}):", args.join(", "));
        }
        self.block_body(b, indent + 1);
    }
}
