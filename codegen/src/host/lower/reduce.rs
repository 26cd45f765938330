//! Built-in reductions (`sum`, `max`, `min`, `argmax`, `argmin`) with the
//! interpreter's order, so results agree bit for bit (`dsl_core::interp`,
//! reduce.rs). The tile is viewed as `[outer, n, inner]` around the axis.
//!
//! - Float `sum` accumulates in f64 and rounds once per result. Along a
//!   contiguous axis (`inner == 1`, `n >= 4`) each line keeps four partial
//!   sums, element `4c + t` added to partial `t` in order of `c`, combined
//!   as `(s0 + s1) + (s2 + s3)`; a strip adds its groups of four in order,
//!   and a group of lines is interleaved so their chains overlap. Otherwise
//!   each result adds its elements in order from `0.0`, strips of results
//!   at a time.
//! - `max`/`min` fold with `maxnum`/`minnum` from NaN (so NaN is ignored
//!   unless every element is NaN), in any order: the result does not
//!   depend on it. Integer sums wrap, in any order.
//! - `argmax`/`argmin` keep per lane the first best element (NaN skipped),
//!   then take the best lane value, ties to the smallest index; no valid
//!   element gives index 0.
//!
//! Custom combines are in `combine.rs`.

use super::eval::{Idx, IdxKind};
use super::{Lower, Repr};
use crate::Result;
use crate::llvm::{Values, int_order};
use dsl_core::ir::ops::{ReduceKind, ReduceOp};
use dsl_core::ir::{Inst, Value};
use dsl_core::{DType, Elem, Type};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, InstructionOpcode::*, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};

/// Lines of a contiguous reduction interleaved in one pass.
const LINE_GROUP: usize = 8;

/// A reduction's state per lane.
#[derive(Clone, Copy)]
struct Acc<'ctx> {
    /// The running value (`<lanes x T>`, f64 for float sums).
    val: PointerValue<'ctx>,
    /// The best index so far (argmax/argmin), `-1` for none.
    idx: Option<PointerValue<'ctx>>,
}

/// The operand of a reduction or scan, seen along its axis.
pub(super) struct AxisOperand {
    /// The operand.
    pub(super) x: Value,
    /// Its type.
    pub(super) ty: Type,
    /// Its dtype.
    pub(super) dt: DType,
    /// The product of the dimensions before the axis.
    pub(super) outer: usize,
    /// The axis' extent.
    pub(super) n: usize,
    /// The product of the dimensions after the axis.
    pub(super) inner: usize,
}

impl<'ctx> Lower<'ctx, '_> {
    /// The operand of the reduction or scan `i` (`what`, for the error on
    /// pointers) along `axis`.
    pub(super) fn axis_operand(&self, i: Inst, axis: usize, what: &str) -> Result<AxisOperand> {
        let x = self.f.insts[i].args[0];
        let ty = self.f.ty(x).clone();
        let Elem::Scalar(dt) = ty.elem else {
            return Err(self.unsupported(i, format!("a {what} of pointers")));
        };
        let outer: usize = ty.shape[..axis].iter().product();
        let inner: usize = ty.shape[axis + 1..].iter().product();
        let n = ty.shape[axis];
        Ok(AxisOperand { x, ty, dt, outer, n, inner })
    }

    /// `reduce {axis, kind} x` with a built-in kind (custom kinds go to
    /// `lower_custom_reduce`).
    pub(super) fn lower_reduce(&mut self, i: Inst, r: ReduceOp) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let AxisOperand { x, dt, outer, n, inner, .. } = self.axis_operand(i, r.axis, "reduction")?;
        let res = d.results[0];
        let rt = f.ty(res).clone();
        let arr = self.alloc_array(rt.elem, outer * inner)?;
        if inner == 1 && n >= 4 {
            self.reduce_lines(i, r.kind, dt, x, outer, n, arr)?;
        } else {
            self.reduce_strided(i, r.kind, dt, x, (outer, n, inner), arr)?;
        }
        self.memo.clear();
        if rt.rank() == 0 {
            let v = self.load_elem(rt.elem, arr, self.c32(0))?;
            self.set(res, Repr::Scalar(v));
        } else {
            self.set(res, Repr::Array(arr));
        }
        Ok(())
    }

    /// The element type a reduction accumulates in.
    fn acc_elem(&self, kind: ReduceKind, dt: DType) -> BasicTypeEnum<'ctx> {
        if kind == ReduceKind::Sum && dt.is_float() {
            self.ctx.f64_type().into()
        } else {
            self.reg_elem(Elem::Scalar(dt))
        }
    }

    /// The starting value of an accumulator of `lanes` lanes.
    fn acc_init(&self, kind: ReduceKind, dt: DType, lanes: u32) -> Result<BasicValueEnum<'ctx>> {
        let et = self.acc_elem(kind, dt);
        let v: BasicValueEnum<'ctx> = match (kind, dt.is_float()) {
            (ReduceKind::Sum, _) => et.const_zero(),
            (_, true) => et.into_float_type().const_float(f64::NAN).into(),
            (ReduceKind::Max | ReduceKind::Argmax, false) => {
                let (lo, _) = dt.int_range().unwrap_or((0, 0));
                et.into_int_type().const_int(lo as u64, false).into()
            }
            (_, false) => {
                let (_, hi) = dt.int_range().unwrap_or((0, 0));
                et.into_int_type().const_int(hi as u64, false).into()
            }
        };
        self.splat(v, lanes)
    }

    /// Fresh accumulator slots of `lanes` lanes, initialized.
    fn new_acc(&mut self, kind: ReduceKind, dt: DType, lanes: u32) -> Result<Acc<'ctx>> {
        let vt: BasicTypeEnum<'ctx> = self.vec_of(self.acc_elem(kind, dt), lanes).into();
        let val = self.alloca(vt, 64)?;
        let idx = if matches!(kind, ReduceKind::Argmax | ReduceKind::Argmin) {
            Some(self.alloca(self.i32t().vec_type(lanes).into(), 64)?)
        } else {
            None
        };
        Ok(Acc { val, idx })
    }

    /// Resets `acc` to the starting value.
    fn reset_acc(&self, kind: ReduceKind, dt: DType, lanes: u32, acc: Acc<'ctx>) -> Result<()> {
        self.b.build_store(acc.val, self.acc_init(kind, dt, lanes)?)?;
        if let Some(p) = acc.idx {
            let m1 = self.splat(self.c32(-1).into(), lanes)?;
            self.b.build_store(p, m1)?;
        }
        Ok(())
    }

    /// Folds strip `v` (element indices `k` along the axis, an `i32`
    /// vector, for arg reductions) into `acc`.
    fn fold(
        &self,
        kind: ReduceKind,
        dt: DType,
        acc: Acc<'ctx>,
        v: BasicValueEnum<'ctx>,
        k: Option<BasicValueEnum<'ctx>>,
    ) -> Result<()> {
        let lanes = self.lanes_of(v).unwrap_or(1);
        let vt = self.vec_of(self.acc_elem(kind, dt), lanes);
        let a = self.b.build_load(vt, acc.val, "")?;
        let signed = dt.is_signed_int();
        let new = match kind {
            ReduceKind::Sum if dt.is_float() => {
                let x =
                    if dt == DType::F64 { v } else { self.cast_to(FPExt, v, self.ctx.f64_type().into())? };
                self.bin(FAdd, a, x)?
            }
            ReduceKind::Sum => self.bin(Add, a, v)?,
            ReduceKind::Max | ReduceKind::Min if dt.is_float() => {
                let name = if kind == ReduceKind::Max { "llvm.maxnum" } else { "llvm.minnum" };
                self.call1(name, &[a, v])?
            }
            ReduceKind::Max | ReduceKind::Min => {
                let c = self.icmp(int_order(kind == ReduceKind::Max, signed), v, a)?;
                self.select(c, v, a)?
            }
            ReduceKind::Argmax | ReduceKind::Argmin => {
                let (Some(ip), Some(k)) = (acc.idx, k) else {
                    return Err(crate::Error::Llvm("host lowering: arg reduction without indices".into()));
                };
                let iv = self.b.build_load(self.i32t().vec_type(lanes), ip, "")?;
                let none = self.icmp(IntPredicate::SLT, iv, self.int_like(iv, 0)?)?;
                let better = if dt.is_float() {
                    let p =
                        if kind == ReduceKind::Argmax { FloatPredicate::OGT } else { FloatPredicate::OLT };
                    let b = self.fcmp(p, v, a)?;
                    let valid = self.fcmp(FloatPredicate::ORD, v, v)?;
                    self.bin(And, valid, self.bin(Or, none, b)?)?
                } else {
                    let b = self.icmp(int_order(kind == ReduceKind::Argmax, signed), v, a)?;
                    self.bin(Or, none, b)?
                };
                let ni = self.select(better, k, iv)?;
                self.b.build_store(ip, ni)?;
                self.select(better, v, a)?
            }
            ReduceKind::Custom => return Err(crate::Error::Llvm("host lowering: custom fold".into())),
        };
        self.b.build_store(acc.val, new)?;
        Ok(())
    }

    /// The reduced value of `acc` across its lanes (for arg reductions the
    /// index), in the result's register form.
    fn finish(
        &self,
        kind: ReduceKind,
        dt: DType,
        acc: Acc<'ctx>,
        lanes: u32,
    ) -> Result<BasicValueEnum<'ctx>> {
        let vt = self.vec_of(self.acc_elem(kind, dt), lanes);
        let a = self.b.build_load(vt, acc.val, "")?;
        let signed = dt.is_signed_int();
        let hname = |max: bool| -> &'static str {
            match (dt.is_float(), max, signed) {
                (true, true, _) => "llvm.vector.reduce.fmax",
                (true, false, _) => "llvm.vector.reduce.fmin",
                (false, true, true) => "llvm.vector.reduce.smax",
                (false, true, false) => "llvm.vector.reduce.umax",
                (false, false, true) => "llvm.vector.reduce.smin",
                (false, false, false) => "llvm.vector.reduce.umin",
            }
        };
        match kind {
            ReduceKind::Sum if dt.is_float() => {
                // One lane per result here (the strided path): no cross-lane sum.
                Err(crate::Error::Llvm("host lowering: a float sum finishes per lane".into()))
            }
            ReduceKind::Sum => self.call1("llvm.vector.reduce.add", &[a]),
            ReduceKind::Max => self.call1(hname(true), &[a]),
            ReduceKind::Min => self.call1(hname(false), &[a]),
            ReduceKind::Argmax | ReduceKind::Argmin => {
                let Some(ip) = acc.idx else {
                    return Err(crate::Error::Llvm("host lowering: arg reduction without indices".into()));
                };
                let iv = self.b.build_load(self.i32t().vec_type(lanes), ip, "")?;
                let valid = self.icmp(IntPredicate::SGE, iv, self.int_like(iv, 0)?)?;
                let max = kind == ReduceKind::Argmax;
                let neutral =
                    self.acc_init(if max { ReduceKind::Max } else { ReduceKind::Min }, dt, lanes)?;
                let vals = self.select(valid, a, neutral)?;
                let best = self.call1(hname(max), &[vals])?;
                let best_v = self.splat(best, lanes)?;
                let eq = if dt.is_float() {
                    self.fcmp(FloatPredicate::OEQ, a, best_v)?
                } else {
                    self.icmp(IntPredicate::EQ, a, best_v)?
                };
                let hit = self.bin(And, valid, eq)?;
                let big = self.int_like(iv, i32::MAX as u64)?;
                let cand = self.select(hit, iv, big)?;
                let first = self.call1("llvm.vector.reduce.smin", &[cand])?;
                let any = self.icmp(IntPredicate::NE, first, self.c32(i64::from(i32::MAX)).into())?;
                self.select(any, first, self.c32(0).into())
            }
            ReduceKind::Custom => Err(crate::Error::Llvm("host lowering: custom finish".into())),
        }
    }

    /// Reductions of contiguous lines (`inner == 1`, `n >= 4`): strips
    /// along each line, a group of lines interleaved.
    #[allow(clippy::too_many_arguments)]
    fn reduce_lines(
        &mut self,
        i: Inst,
        kind: ReduceKind,
        dt: DType,
        x: dsl_core::ir::Value,
        outer: usize,
        n: usize,
        out: PointerValue<'ctx>,
    ) -> Result<()> {
        let _ = i;
        let g = outer.min(LINE_GROUP);
        let lanes = self.lanes.min(n as u32);
        let float_sum = kind == ReduceKind::Sum && dt.is_float();
        let acc_lanes = if float_sum { 4 } else { lanes };
        let mut accs = Vec::with_capacity(g);
        for _ in 0..g {
            accs.push(self.new_acc(kind, dt, acc_lanes)?);
        }
        let res_elem = if matches!(kind, ReduceKind::Argmax | ReduceKind::Argmin) {
            Elem::Scalar(DType::I32)
        } else {
            Elem::Scalar(dt)
        };
        self.emit_loop(self.c32(0), self.c32(outer as i64), g as i64, true, |l, g0| {
            for &a in &accs {
                l.reset_acc(kind, dt, acc_lanes, a)?;
            }
            l.emit_loop(l.c32(0), l.c32(n as i64), i64::from(lanes), true, |l, p| {
                l.memo.clear();
                for (gi, &a) in accs.iter().enumerate() {
                    let line = l.b.build_int_add(g0, l.c32(gi as i64), "")?;
                    let start = l.b.build_int_mul(line, l.c32(n as i64), "")?;
                    let base = l.b.build_int_add(start, p, "")?;
                    let v = l.eval(x, &Idx::affine(base, lanes))?;
                    if float_sum {
                        let v =
                            if dt == DType::F64 { v } else { l.cast_to(FPExt, v, l.ctx.f64_type().into())? };
                        for q in 0..lanes / 4 {
                            let part = l.sub_vector(v.into_vector_value(), 4 * q, 4)?;
                            l.fold(kind, dt, a, part.into(), None)?;
                        }
                    } else {
                        let k = if a.idx.is_some() {
                            let ps = l.splat(p.into(), lanes)?;
                            Some(l.bin(Add, ps, l.iota(lanes).into())?)
                        } else {
                            None
                        };
                        l.fold(kind, dt, a, v, k)?;
                    }
                }
                Ok(())
            })?;
            for (gi, &a) in accs.iter().enumerate() {
                let r = if float_sum {
                    let vt = l.ctx.f64_type().vec_type(4);
                    let s = l.b.build_load(vt, a.val, "")?;
                    let (s0, s1, s2, s3) = (l.lane(s, 0)?, l.lane(s, 1)?, l.lane(s, 2)?, l.lane(s, 3)?);
                    let t = l.bin(FAdd, l.bin(FAdd, s0, s1)?, l.bin(FAdd, s2, s3)?)?;
                    if dt == DType::F64 { t } else { l.narrow(dt, t)? }
                } else {
                    l.finish(kind, dt, a, acc_lanes)?
                };
                let at = l.b.build_int_add(g0, l.c32(gi as i64), "")?;
                l.store_strip(res_elem, out, at, l.splat(r, 1)?)?;
            }
            Ok(())
        })
    }

    /// Reductions with each result's elements folded in order, strips of
    /// results at a time (`inner > 1`, or short lines).
    fn reduce_strided(
        &mut self,
        i: Inst,
        kind: ReduceKind,
        dt: DType,
        x: dsl_core::ir::Value,
        (outer, n, inner): (usize, usize, usize),
        out: PointerValue<'ctx>,
    ) -> Result<()> {
        let _ = i;
        let total = outer * inner;
        let lanes = self.lanes.min(total as u32).max(1);
        let res_elem = if matches!(kind, ReduceKind::Argmax | ReduceKind::Argmin) {
            Elem::Scalar(DType::I32)
        } else {
            Elem::Scalar(dt)
        };
        let acc = self.new_acc(kind, dt, lanes)?;
        let inner_sh = inner.trailing_zeros() as u64;
        self.emit_loop(self.c32(0), self.c32(total as i64), i64::from(lanes), true, |l, r0| {
            l.reset_acc(kind, dt, lanes, acc)?;
            // Source index of result r at k = 0: (r / inner) * n * inner + r % inner.
            let src0 = |l: &Self, r: BasicValueEnum<'ctx>| -> Result<BasicValueEnum<'ctx>> {
                let o = l.bin(LShr, r, l.int_like(r, inner_sh)?)?;
                let o = l.bin(Mul, o, l.int_like(r, (n * inner) as u64)?)?;
                let w = l.bin(And, r, l.int_like(r, inner as u64 - 1)?)?;
                l.bin(Add, o, w)
            };
            let affine = lanes as usize <= inner;
            let start: BasicValueEnum<'ctx> = if affine {
                src0(l, r0.into())?
            } else {
                let rv = l.bin(Add, l.splat(r0.into(), lanes)?, l.iota(lanes).into())?;
                src0(l, rv)?
            };
            l.emit_loop(l.c32(0), l.c32(n as i64), 1, true, |l, k| {
                l.memo.clear();
                let off = l.b.build_int_mul(k, l.c32(inner as i64), "")?;
                let idx = match start {
                    BasicValueEnum::IntValue(s) => Idx::affine(l.b.build_int_add(s, off, "")?, lanes),
                    other => {
                        let offv = l.splat(off.into(), lanes)?;
                        let g = l.bin(Add, other, offv)?.into_vector_value();
                        Idx { lanes, kind: IdxKind::General(g) }
                    }
                };
                let v = l.eval(x, &idx)?;
                let kv = if acc.idx.is_some() { Some(l.splat(k.into(), lanes)?) } else { None };
                l.fold(kind, dt, acc, v, kv)
            })?;
            let vt = l.vec_of(l.acc_elem(kind, dt), lanes);
            let r = match kind {
                ReduceKind::Sum if dt.is_float() && dt != DType::F64 => {
                    let s = l.b.build_load(vt, acc.val, "")?;
                    l.narrow(dt, s)?
                }
                ReduceKind::Argmax | ReduceKind::Argmin => {
                    let ip =
                        acc.idx.ok_or_else(|| crate::Error::Llvm("arg reduction without indices".into()))?;
                    let iv = l.b.build_load(l.i32t().vec_type(lanes), ip, "")?;
                    let z = l.int_like(iv, 0)?;
                    let neg = l.icmp(IntPredicate::SLT, iv, z)?;
                    l.select(neg, z, iv)?
                }
                _ => l.b.build_load(vt, acc.val, "")?,
            };
            l.store_strip(res_elem, out, r0, r)
        })
    }
}
