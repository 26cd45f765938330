//! Structured control flow: `for`, `if`, `while` and the values their
//! terminators hand over.
//!
//! Carried and result values live in slots: a stack array per tile, an
//! `alloca` per scalar (which LLVM promotes to registers). A `for`'s
//! carried slots are also its results and its body's block arguments; an
//! `if`'s result slots are written by either branch; a `while` has carried
//! slots (the `before` region's arguments) and forwarded slots (the `after`
//! region's arguments and the results).
//!
//! A `yield` computes every yielded tile into its slot. A yielded
//! expression may read carried slots (a `for` body reads its own block
//! arguments); it is written in place when it reads its own slot only at
//! the element it writes, after every other yielded expression that reads
//! that slot (a software-pipelined loop's accumulator before the next
//! iteration's loads); otherwise (or on a cycle of such reads) it goes
//! through a temporary array first, so every yielded value is computed from
//! the iteration's values.
//!
//! `for` runs while `iv < ub` (signed or unsigned by the induction
//! variable's dtype) and stops when `iv + step` overflows, as the
//! interpreter does; a step that is not positive is a runtime error.

use super::{Lower, Repr};
use crate::Result;
use dsl_core::Elem;
use dsl_core::ir::ops::{ControlOp, Op, ShapeOp};
use dsl_core::ir::{Block, Inst, Value};
use inkwell::IntPredicate;
use inkwell::types::BasicTypeEnum;
use inkwell::values::PointerValue;
use rustc_hash::FxHashMap;

/// Where one carried or result value lives.
#[derive(Clone, Copy, Debug)]
pub(super) enum Slot<'ctx> {
    /// A scalar in an `alloca`.
    Scalar(PointerValue<'ctx>, BasicTypeEnum<'ctx>),
    /// A tile's array.
    Tile(PointerValue<'ctx>, Elem, usize),
}

impl<'ctx> Lower<'ctx, '_> {
    /// A fresh slot for a value of type `v`'s.
    fn slot_for(&mut self, v: Value) -> Result<Slot<'ctx>> {
        let t = self.f.ty(v).clone();
        if t.rank() == 0 {
            let ty = self.reg_elem(t.elem);
            Ok(Slot::Scalar(self.alloca(ty, 8)?, ty))
        } else {
            Ok(Slot::Tile(self.alloc_array(t.elem, t.numel())?, t.elem, t.numel()))
        }
    }

    /// Fresh slots for `vs`, one each.
    fn slots_for(&mut self, vs: &[Value]) -> Result<Vec<Slot<'ctx>>> {
        vs.iter().map(|&v| self.slot_for(v)).collect()
    }

    /// Stores the initial values `vs` into the slot at each one's position.
    fn init_slots(&mut self, vs: &[Value], slots: &[Slot<'ctx>]) -> Result<()> {
        for (&v, s) in vs.iter().zip(slots) {
            match *s {
                Slot::Scalar(p, _) => {
                    let x = self.scalar(v)?;
                    self.b.build_store(p, x)?;
                }
                Slot::Tile(p, elem, n) => self.write_value(v, p, elem, n)?,
            }
        }
        Ok(())
    }

    /// Binds each of `vs` to what the slot at its position holds now.
    fn bind_slots(&mut self, vs: &[Value], slots: &[Slot<'ctx>]) -> Result<()> {
        for (&v, &s) in vs.iter().zip(slots) {
            self.bind_slot(v, s)?;
        }
        Ok(())
    }

    /// Binds `v` to what slot `s` holds now.
    fn bind_slot(&mut self, v: Value, s: Slot<'ctx>) -> Result<()> {
        match s {
            Slot::Scalar(p, ty) => {
                let x = self.b.build_load(ty, p, "")?;
                self.set(v, Repr::Scalar(x));
            }
            Slot::Tile(p, ..) => self.set(v, Repr::Array(p)),
        }
        Ok(())
    }

    /// The carried slots `v` (inline, recursively) reads, with whether each
    /// read is at the element being computed.
    fn slot_reads(
        &self,
        v: Value,
        slots: &FxHashMap<Value, usize>,
        same: bool,
        out: &mut Vec<(usize, bool)>,
    ) {
        if let Some(&k) = slots.get(&v) {
            out.push((k, same));
            return;
        }
        let Ok(Repr::Inline) = self.get(v) else { return };
        let dsl_core::ir::ValueDef::Result(i, _) = self.f.values[v].def else { return };
        let d = &self.f.insts[i];
        // Elementwise ops (loads too) read their operands at the element
        // they compute; broadcasts, permutes, joins and splits do not.
        let keeps = !matches!(&d.op, Op::Shape(s) if !matches!(s, ShapeOp::Reshape { .. } | ShapeOp::ExpandDims { .. }));
        for &a in &d.args {
            self.slot_reads(a, slots, same && keeps, out);
        }
    }

    /// Writes the operands of terminator `term` (from its first `skip`
    /// operands on) into `slots`; `carried` maps the block arguments that
    /// are those slots' current values (their reads decide in-place
    /// writes).
    fn write_slots(
        &mut self,
        term: Inst,
        skip: usize,
        slots: &[Slot<'ctx>],
        carried: &FxHashMap<Value, usize>,
    ) -> Result<()> {
        let ys: Vec<Value> = self.f.insts[term].args[skip..].to_vec();
        let mut reads: Vec<Vec<(usize, bool)>> = Vec::with_capacity(ys.len());
        for (k, &y) in ys.iter().enumerate() {
            let mut r = Vec::new();
            if carried.get(&y) != Some(&k) {
                self.slot_reads(y, carried, true, &mut r);
            }
            reads.push(r);
        }
        let mut scalars = Vec::new();
        // Tiles written in place must come after every other yielded value
        // that reads their slot; those that read their own slot elsewhere
        // than at the element they write, or that sit on a cycle of such
        // reads, go through temporaries (computed first, copied last).
        let mut pending = Vec::new();
        let mut temps = Vec::new();
        for (k, (&y, s)) in ys.iter().zip(slots).enumerate() {
            match *s {
                Slot::Scalar(p, _) => scalars.push((p, self.scalar(y)?)),
                Slot::Tile(..) if carried.get(&y) == Some(&k) => {}
                Slot::Tile(..) => {
                    if reads[k].iter().all(|&(j, same)| j != k || same) {
                        pending.push(k);
                    } else {
                        temps.push(k);
                    }
                }
            }
        }
        let mut order = Vec::new();
        while !pending.is_empty() {
            let ready = pending
                .iter()
                .position(|&k| !pending.iter().any(|&j| j != k && reads[j].iter().any(|&(s, _)| s == k)));
            match ready {
                Some(at) => order.push(pending.remove(at)),
                None => temps.push(pending.remove(0)),
            }
        }
        let mut copies = Vec::new();
        for &k in &temps {
            if let Slot::Tile(p, elem, n) = slots[k] {
                let t = self.alloc_array(elem, n)?;
                self.write_value(ys[k], t, elem, n)?;
                copies.push((t, p, elem, n));
            }
        }
        for &k in &order {
            if let Slot::Tile(p, elem, n) = slots[k] {
                self.write_value(ys[k], p, elem, n)?;
            }
        }
        for (t, p, elem, n) in copies {
            let size = u64::from(super::types::elem_size(elem)) * n as u64;
            let bytes = self.ctx.i64_type().const_int(size, false);
            self.b
                .build_memcpy(p, 64, t, 64, bytes)
                .map_err(|e| crate::Error::Llvm(format!("memcpy: {e}")))?;
        }
        for (p, v) in scalars {
            self.b.build_store(p, v)?;
        }
        Ok(())
    }

    /// Lowers block `b` and checks that it ends in terminator `want`.
    fn region_block(&mut self, i: Inst, b: Block, want: ControlOp) -> Result<Inst> {
        let term = self.block(b)?.ok_or_else(|| self.unsupported(i, "a region without a terminator"))?;
        match self.f.insts[term].op {
            Op::Control(c) if c == want => Ok(term),
            _ => Err(self.unsupported(i, format!("a region that does not end in `{}`", want.name()))),
        }
    }

    /// `for lb, ub, step, init...`.
    pub(super) fn lower_for(&mut self, i: Inst) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let (lb, ub, step) = (self.scalar(d.args[0])?, self.scalar(d.args[1])?, self.scalar(d.args[2])?);
        let iv_dt = f.ty(d.args[0]).dtype();
        let signed = iv_dt.is_signed_int();
        let (lb, ub, step) = (lb.into_int_value(), ub.into_int_value(), step.into_int_value());
        let body = f.entry(d.regions[0]);
        let args = f.blocks[body].args.clone();
        let results = d.results.clone();
        let slots = self.slots_for(&results)?;
        // The initial values.
        self.init_slots(&d.args[3..], &slots)?;
        let code = self.error_site(i, "the step of a `for` loop must be positive".into());
        let bad = self.b.build_int_compare(IntPredicate::SLE, step, step.get_type().const_zero(), "")?;
        let bad = if signed {
            bad
        } else {
            self.b.build_int_compare(IntPredicate::EQ, step, step.get_type().const_zero(), "")?
        };
        self.fail_if(bad, code)?;
        let lt = if signed { IntPredicate::SLT } else { IntPredicate::ULT };
        let pre = self.cur_block()?;
        let head = self.ctx.append_basic_block(self.func, "for");
        let exit = self.ctx.append_basic_block(self.func, "for.end");
        let go = self.b.build_int_compare(lt, lb, ub, "")?;
        self.b.build_conditional_branch(go, head, exit)?;
        self.b.position_at_end(head);
        let iv = self.b.build_phi(lb.get_type(), "iv")?;
        iv.add_incoming(&[(&lb, pre)]);
        let ivv = iv.as_basic_value().into_int_value();
        self.set(args[0], Repr::Scalar(ivv.into()));
        let mut carried = FxHashMap::default();
        for (k, (&a, &s)) in args[1..].iter().zip(&slots).enumerate() {
            self.bind_slot(a, s)?;
            carried.insert(a, k);
        }
        let term = self.region_block(i, body, ControlOp::Yield)?;
        self.write_slots(term, 0, &slots, &carried)?;
        self.memo.clear();
        // iv + step, stopping when it overflows the induction variable's type.
        let name = if signed { "llvm.sadd.with.overflow" } else { "llvm.uadd.with.overflow" };
        let pair = self
            .intrinsic(name, &[ivv.get_type().into()], &[ivv.into(), step.into()])?
            .ok_or_else(|| crate::Error::Llvm(format!("`{name}` returned no value")))?
            .into_struct_value();
        let next = self.b.build_extract_value(pair, 0, "")?.into_int_value();
        let ovf = self.b.build_extract_value(pair, 1, "")?.into_int_value();
        let more = self.b.build_int_compare(lt, next, ub, "")?;
        let no_ovf = self.b.build_not(ovf, "")?;
        let again = self.b.build_and(more, no_ovf, "")?;
        let latch = self.cur_block()?;
        iv.add_incoming(&[(&next, latch)]);
        self.b.build_conditional_branch(again, head, exit)?;
        self.b.position_at_end(exit);
        self.bind_slots(&results, &slots)
    }

    /// `if cond` with results.
    pub(super) fn lower_if(&mut self, i: Inst) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let cond = self.scalar(d.args[0])?.into_int_value();
        let results = d.results.clone();
        let slots = self.slots_for(&results)?;
        let then_b = self.ctx.append_basic_block(self.func, "then");
        let else_b = self.ctx.append_basic_block(self.func, "else");
        let join = self.ctx.append_basic_block(self.func, "endif");
        self.b.build_conditional_branch(cond, then_b, else_b)?;
        let none = FxHashMap::default();
        for (r, bb) in [(d.regions[0], then_b), (d.regions[1], else_b)] {
            self.b.position_at_end(bb);
            self.memo.clear();
            let term = self.region_block(i, f.entry(r), ControlOp::Yield)?;
            self.write_slots(term, 0, &slots, &none)?;
            self.memo.clear();
            self.b.build_unconditional_branch(join)?;
        }
        self.b.position_at_end(join);
        self.bind_slots(&results, &slots)
    }

    /// `while init...`: `before` ends in `condition c, forwarded...`,
    /// `after` in `yield carried...`.
    pub(super) fn lower_while(&mut self, i: Inst) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let before = f.entry(d.regions[0]);
        let after = f.entry(d.regions[1]);
        let bargs = f.blocks[before].args.clone();
        let aargs = f.blocks[after].args.clone();
        let carried = self.slots_for(&bargs)?;
        let fwd = self.slots_for(&aargs)?;
        self.init_slots(&d.args, &carried)?;
        let head = self.ctx.append_basic_block(self.func, "while");
        let body = self.ctx.append_basic_block(self.func, "while.body");
        let exit = self.ctx.append_basic_block(self.func, "while.end");
        self.b.build_unconditional_branch(head)?;
        self.b.position_at_end(head);
        self.memo.clear();
        let mut cmap = FxHashMap::default();
        for (k, (&a, &s)) in bargs.iter().zip(&carried).enumerate() {
            self.bind_slot(a, s)?;
            cmap.insert(a, k);
        }
        let term = self.region_block(i, before, ControlOp::Condition)?;
        let c = self.scalar(f.insts[term].args[0])?.into_int_value();
        self.write_slots(term, 1, &fwd, &FxHashMap::default())?;
        self.memo.clear();
        self.b.build_conditional_branch(c, body, exit)?;
        self.b.position_at_end(body);
        self.bind_slots(&aargs, &fwd)?;
        let term = self.region_block(i, after, ControlOp::Yield)?;
        self.write_slots(term, 0, &carried, &cmap)?;
        self.memo.clear();
        self.b.build_unconditional_branch(head)?;
        self.b.position_at_end(exit);
        self.bind_slots(&d.results, &fwd)
    }
}
