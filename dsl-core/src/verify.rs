//! The verifier: checks a finished function against the IR invariants and
//! collects every violation (not just the first).
//!
//! Checked: every operand is defined before use in the same or an enclosing
//! region (SSA dominance for structured regions); operand and result types
//! satisfy the op's inference rule; tile dimensions are powers of two; regions
//! have one block and the right terminator with the right types; terminators
//! appear only at the end of op regions; instructions and values are not
//! shared between blocks; `gdc_wait` appears at most once, in the body block,
//! after no store, atomic or volatile load (see [`crate::ir::ops::program`]).

use crate::dtype::Type;
use crate::error::{Diagnostic, Error, Result};
use crate::ir::ops::{ControlOp, MemoryOp, ProgramOp, ReduceKind, ScanKind};
use crate::ir::{Block, Function, Inst, Op, Region, Value};
use rustc_hash::FxHashSet;

/// Verifies `f`; returns every violation as [`Error::Verify`].
pub fn verify(f: &Function) -> Result<()> {
    let diags = verify_collect(f);
    if diags.is_empty() { Ok(()) } else { Err(Error::Verify { kernel: f.name.clone(), diagnostics: diags }) }
}

/// Verifies `f` and returns the violations found (empty when valid).
pub fn verify_collect(f: &Function) -> Vec<Diagnostic> {
    let mut v =
        Verifier { f, diags: Vec::new(), defined: FxHashSet::default(), seen_insts: FxHashSet::default() };
    v.check_params();
    v.region(f.body, None);
    v.check_grid_wait();
    v.diags
}

struct Verifier<'a> {
    f: &'a Function,
    diags: Vec<Diagnostic>,
    /// Values visible at the current point (scoped by `region`).
    defined: FxHashSet<Value>,
    seen_insts: FxHashSet<Inst>,
}

impl Verifier<'_> {
    fn err(&mut self, inst: Option<Inst>, message: String) {
        let (loc, op) = match inst {
            Some(i) => (self.f.insts[i].loc.clone(), Some(self.f.insts[i].op.name())),
            None => (self.f.loc.clone(), None),
        };
        self.diags.push(Diagnostic { loc, op, message });
    }

    fn check_params(&mut self) {
        let entry = self.f.body_block();
        let args = &self.f.blocks[entry].args;
        if args.len() != self.f.params.len() || self.f.params.iter().zip(args).any(|(p, a)| p.value != *a) {
            self.err(None, "the body block's arguments must be exactly the parameters, in order".into());
        }
        for p in &self.f.params {
            let t = self.f.ty(p.value);
            if !t.is_scalar() {
                self.err(None, format!("parameter `{}` must be a scalar or pointer, found {t}", p.name));
            }
        }
    }

    /// The `gdc_wait` rule: every thread runs the one wait (so it sits in the
    /// body block, outside control flow), and nothing is written before it
    /// (a write could race with the still-running previous kernel).
    fn check_grid_wait(&mut self) {
        let f = self.f;
        let mut waits = Vec::new();
        collect_waits(f, f.body_block(), &mut waits);
        let top = &f.blocks[f.body_block()].insts;
        for (n, &w) in waits.iter().enumerate() {
            if n > 0 {
                self.err(Some(w), "`gdc_wait` may appear only once in a kernel".into());
            } else if !top.contains(&w) {
                self.err(Some(w), "`gdc_wait` must be at the top level of the kernel body, outside `if` and loops, so every thread runs it".into());
            } else if let Some(&st) = top.iter().take_while(|&&i| i != w).find(|&&i| writes(f, i)) {
                let what = f.insts[st].op.name();
                self.err(Some(w), format!("`gdc_wait` must come before every store, atomic and volatile load, but `{what}` at {} precedes it", f.insts[st].loc));
            }
        }
    }

    fn check_type(&mut self, inst: Option<Inst>, t: &Type) {
        if let Some(d) = t.shape.iter().find(|d| !d.is_power_of_two()) {
            self.err(inst, format!("tile dimension {d} of {t} is not a power of two"));
        }
    }

    /// Checks a region; `owner` is the op owning it (None for the body). Returns the
    /// terminator's operand types, if it ends with one.
    fn region(&mut self, r: Region, owner: Option<Inst>) -> Option<(ControlOp, Vec<Type>)> {
        let blocks = &self.f.regions[r].blocks;
        if blocks.len() != 1 {
            self.err(owner, format!("a region must have exactly one block, found {}", blocks.len()));
            return None;
        }
        if self.f.regions[r].parent != owner {
            self.err(owner, format!("{r} records the wrong parent op"));
        }
        let b = blocks[0];
        let saved = self.defined.clone();
        let term = self.block(b, owner.is_some());
        self.defined = saved;
        term
    }

    fn block(&mut self, b: Block, needs_terminator: bool) -> Option<(ControlOp, Vec<Type>)> {
        let data = &self.f.blocks[b];
        for &a in &data.args {
            self.defined.insert(a);
            let t = self.f.ty(a).clone();
            self.check_type(None, &t);
        }
        let n = data.insts.len();
        let mut term = None;
        for (idx, &i) in data.insts.iter().enumerate() {
            if !self.seen_insts.insert(i) {
                self.err(Some(i), format!("{i} appears in more than one place"));
                continue;
            }
            if self.f.insts[i].parent != Some(b) {
                self.err(Some(i), format!("{i} records the wrong parent block"));
            }
            let is_term = self.f.insts[i].op.is_terminator();
            if is_term && idx + 1 != n {
                self.err(Some(i), "a terminator must be the last op of its block".into());
            }
            if is_term && !needs_terminator {
                self.err(Some(i), "the kernel body must not end with a terminator".into());
            }
            self.inst(i);
            if is_term && idx + 1 == n {
                let tys = self.f.insts[i].args.iter().map(|&a| self.f.ty(a).clone()).collect();
                if let Op::Control(c) = self.f.insts[i].op {
                    term = Some((c, tys));
                }
            }
        }
        if needs_terminator && term.is_none() {
            let owner = self.f.regions[data.parent.unwrap_or(self.f.body)].parent;
            self.err(owner, format!("{b} of a region does not end with a terminator"));
        }
        term
    }

    fn inst(&mut self, i: Inst) {
        let data = &self.f.insts[i];
        for &a in &data.args {
            if self.f.values.get(a).is_none() {
                self.err(Some(i), format!("operand {a} does not exist"));
                return;
            }
            if !self.defined.contains(&a) {
                self.err(Some(i), format!("operand {a} is used before its definition or outside its scope"));
            }
        }
        let args: Vec<Type> = data.args.iter().map(|&a| self.f.ty(a).clone()).collect();
        let results: Vec<Type> = data.results.iter().map(|&r| self.f.ty(r).clone()).collect();
        for t in &results {
            self.check_type(Some(i), t);
        }
        if data.regions.len() != data.op.num_regions() {
            self.err(
                Some(i),
                format!(
                    "`{}` must own {} region(s), found {}",
                    data.op.name(),
                    data.op.num_regions(),
                    data.regions.len()
                ),
            );
            return;
        }
        match &data.op {
            Op::Control(ControlOp::If) => self.check_if(i, &args, &results),
            Op::Control(ControlOp::While) => self.check_while(i, &args, &results),
            Op::Control(ControlOp::For) => {
                self.check_inferred(i, &args, &results);
                let mut block_tys = vec![args.first().cloned().unwrap_or(Type::scalar(crate::DType::I32))];
                block_tys.extend(args.iter().skip(3).cloned());
                self.check_region(i, 0, &block_tys, ControlOp::Yield, args.get(3..).unwrap_or(&[]));
            }
            Op::Reduce(r) if r.kind == ReduceKind::Custom => {
                self.check_inferred(i, &args, &results);
                self.check_combine(i, &args);
            }
            Op::Scan(s) if s.kind == ScanKind::Custom => {
                self.check_inferred(i, &args, &results);
                self.check_combine(i, &args);
            }
            _ => self.check_inferred(i, &args, &results),
        }
        for &r in &self.f.insts[i].results {
            self.defined.insert(r);
        }
    }

    fn check_inferred(&mut self, i: Inst, args: &[Type], results: &[Type]) {
        match self.f.insts[i].op.infer(args) {
            Ok(want) if want == results => {}
            Ok(want) => self.err(
                Some(i),
                format!("result types {} do not match the inferred {}", fmt(results), fmt(&want)),
            ),
            Err(m) => self.err(Some(i), m),
        }
    }

    fn check_region(&mut self, i: Inst, idx: usize, block_args: &[Type], term: ControlOp, yields: &[Type]) {
        let r = self.f.insts[i].regions[idx];
        let b = self.f.entry(r);
        let have: Vec<Type> = self.f.blocks[b].args.iter().map(|&a| self.f.ty(a).clone()).collect();
        if have != block_args {
            self.err(Some(i), format!("region {idx} takes {} but must take {}", fmt(&have), fmt(block_args)));
        }
        match self.region(r, Some(i)) {
            Some((t, tys)) if t == term => {
                let tys = if t == ControlOp::Condition { tys.get(1..).unwrap_or(&[]).to_vec() } else { tys };
                if tys != yields {
                    self.err(
                        Some(i),
                        format!(
                            "region {idx} ends with `{}` of {} but must give {}",
                            t.name(),
                            fmt(&tys),
                            fmt(yields)
                        ),
                    );
                }
            }
            Some((t, _)) => {
                self.err(Some(i), format!("region {idx} must end with `{}`, not `{}`", term.name(), t.name()))
            }
            None => {}
        }
    }

    fn check_if(&mut self, i: Inst, args: &[Type], results: &[Type]) {
        if let Err(m) = ControlOp::check_if_operands(args) {
            self.err(Some(i), m);
        }
        self.check_region(i, 0, &[], ControlOp::Yield, results);
        self.check_region(i, 1, &[], ControlOp::Yield, results);
    }

    fn check_while(&mut self, i: Inst, args: &[Type], results: &[Type]) {
        self.check_region(i, 0, args, ControlOp::Condition, results);
        self.check_region(i, 1, results, ControlOp::Yield, args);
    }

    fn check_combine(&mut self, i: Inst, args: &[Type]) {
        let elems: Vec<Type> =
            args.iter().map(|t| Type { elem: t.elem, shape: Default::default() }).collect();
        let block: Vec<Type> = elems.iter().chain(elems.iter()).cloned().collect();
        self.check_region(i, 0, &block, ControlOp::Yield, &elems);
        // A combine runs per pair of elements, in no particular thread: it
        // cannot stop the program.
        let f = self.f;
        if let Some(&r) = f.insts[i].regions.first() {
            let mut waits = Vec::new();
            for &b in &f.regions[r].blocks {
                collect_sync_waits(f, b, &mut waits);
            }
            for w in waits {
                let name = f.insts[w].op.name();
                self.err(
                    Some(w),
                    format!("`{name}` cannot be inside a reduction's or scan's combine function"),
                );
            }
        }
    }
}

/// The `gdc_wait` ops in block `b` and its regions, in program order.
fn collect_waits(f: &Function, b: Block, out: &mut Vec<Inst>) {
    for &i in &f.blocks[b].insts {
        if f.insts[i].op == Op::Program(ProgramOp::GdcWait) {
            out.push(i);
        }
        for &r in &f.insts[i].regions {
            for &rb in &f.regions[r].blocks {
                collect_waits(f, rb, out);
            }
        }
    }
}

/// The `wait_until` and `wait_load` ops in block `b` and its regions.
fn collect_sync_waits(f: &Function, b: Block, out: &mut Vec<Inst>) {
    for &i in &f.blocks[b].insts {
        if matches!(f.insts[i].op, Op::Memory(MemoryOp::WaitUntil { .. } | MemoryOp::WaitLoad { .. })) {
            out.push(i);
        }
        for &r in &f.insts[i].regions {
            for &rb in &f.regions[r].blocks {
                collect_sync_waits(f, rb, out);
            }
        }
    }
}

/// True when instruction `i` (or an op in its regions) stores, performs an
/// atomic, loads volatile or ordered, or waits (reads that synchronize with
/// other kernels). A prefetch reads nothing the kernel sees, so weights may
/// be prefetched while the previous kernel still runs.
fn writes(f: &Function, i: Inst) -> bool {
    matches!(f.insts[i].op, Op::Memory(ref m) if m.has_side_effects() && !matches!(m, MemoryOp::PrefetchL2 { .. }))
        || f.insts[i]
            .regions
            .iter()
            .any(|&r| f.regions[r].blocks.iter().any(|&b| f.blocks[b].insts.iter().any(|&j| writes(f, j))))
}

fn fmt(tys: &[Type]) -> String {
    let parts: Vec<String> = tys.iter().map(|t| t.to_string()).collect();
    format!("({})", parts.join(", "))
}
