//! Built-in scans (`sum`, `max`, `min`, inclusive, optionally reversed)
//! with the interpreter's order (`dsl_core::interp`, reduce.rs): each line
//! runs in scan order from its first element (`init(v) = v`, so a leading
//! `-0.0` stays `-0.0`); float sums carry an f64 state rounded at every
//! output; `max`/`min` pick `b` when `max == (b > a)` after skipping NaN on
//! either side (ties take the newer element, as the interpreter does).
//! Strips run across the lines of the innermost dimensions; a scan along
//! the last axis runs one line at a time.

use super::eval::Idx;
use super::reduce::AxisOperand;
use super::{Lower, Repr};
use crate::Result;
use crate::llvm::{Values, int_order};
use dsl_core::DType;
use dsl_core::ir::Inst;
use dsl_core::ir::ops::{ScanKind, ScanOp};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, InstructionOpcode::*};
use inkwell::{FloatPredicate, IntPredicate};

impl<'ctx> Lower<'ctx, '_> {
    /// `scan {axis, kind, reverse} x` with a built-in kind (custom kinds go
    /// to `lower_custom_scan`).
    pub(super) fn lower_scan(&mut self, i: Inst, s: ScanOp) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let AxisOperand { x, ty: xt, dt, outer, n, inner } = self.axis_operand(i, s.axis, "scan")?;
        let out = self.alloc_array(xt.elem, xt.numel())?;
        let lanes = if inner > 1 { self.lanes.min(inner as u32) } else { 1 };
        let float_sum = s.kind == ScanKind::Sum && dt.is_float();
        let state_elem: BasicTypeEnum<'ctx> =
            if float_sum { self.ctx.f64_type().into() } else { self.reg_elem(xt.elem) };
        let state = self.alloca(self.vec_of(state_elem, lanes).into(), 64)?;
        let total = outer * inner;
        let inner_sh = inner.trailing_zeros() as u64;
        let (kind, reverse) = (s.kind, s.reverse);
        self.emit_loop(self.c32(0), self.c32(total as i64), i64::from(lanes), true, |l, r0| {
            // The line start of result strip r0: (r0 / inner) * n * inner + r0 % inner.
            let o = l.b.build_right_shift(r0, l.c32(inner_sh as i64), false, "")?;
            let o = l.b.build_int_mul(o, l.c32((n * inner) as i64), "")?;
            let w = l.b.build_and(r0, l.c32(inner as i64 - 1), "")?;
            let start = l.b.build_int_add(o, w, "")?;
            l.emit_loop(l.c32(0), l.c32(n as i64), 1, true, |l, kk| {
                l.memo.clear();
                let k = if reverse { l.b.build_int_sub(l.c32(n as i64 - 1), kk, "")? } else { kk };
                let off = l.b.build_int_mul(k, l.c32(inner as i64), "")?;
                let at = l.b.build_int_add(start, off, "")?;
                let v = l.eval(x, &Idx::affine(at, lanes))?;
                let v = if float_sum && dt != DType::F64 {
                    l.cast_to(FPExt, v, l.ctx.f64_type().into())?
                } else {
                    v
                };
                let first = l.b.build_int_compare(IntPredicate::EQ, kk, l.c32(0), "")?;
                let prev = l.b.build_load(l.vec_of(state_elem, lanes), state, "")?;
                let step = l.scan_step(kind, dt, prev, v)?;
                let first_v = l.splat(first.into(), lanes)?;
                let next = l.select(first_v, v, step)?;
                l.b.build_store(state, next)?;
                let outv = if float_sum && dt != DType::F64 { l.narrow(dt, next)? } else { next };
                l.store_strip(xt.elem, out, at, outv)
            })
        })?;
        self.memo.clear();
        self.set(d.results[0], Repr::Array(out));
        Ok(())
    }

    /// One step of a built-in scan: the new state from `prev` and `v`.
    fn scan_step(
        &self,
        kind: ScanKind,
        dt: DType,
        prev: BasicValueEnum<'ctx>,
        v: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        match kind {
            ScanKind::Sum if dt.is_float() => self.bin(FAdd, prev, v),
            ScanKind::Sum => self.bin(Add, prev, v),
            ScanKind::Max | ScanKind::Min => {
                let max = kind == ScanKind::Max;
                // `max == (b > a)` picks b; NaN on one side picks the other.
                let gt = if dt.is_float() {
                    self.fcmp(FloatPredicate::OGT, v, prev)?
                } else {
                    self.icmp(int_order(true, dt.is_signed_int()), v, prev)?
                };
                let pick_b = if max { gt } else { self.bin(Xor, gt, self.int_like(gt, 1)?)? };
                let r = self.select(pick_b, v, prev)?;
                if !dt.is_float() {
                    return Ok(r);
                }
                let b_nan = self.fcmp(FloatPredicate::UNO, v, v)?;
                let a_nan = self.fcmp(FloatPredicate::UNO, prev, prev)?;
                let r = self.select(a_nan, v, r)?;
                self.select(b_nan, prev, r)
            }
            ScanKind::Custom => Err(crate::Error::Llvm("host lowering: custom scan step".into())),
        }
    }
}
