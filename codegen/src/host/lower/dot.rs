//! `dot a, b, acc` as a register-blocked micro-kernel with the interpreter's
//! arithmetic (`dsl_core::interp`, dot.rs), so products agree bit for bit.
//!
//! Float inputs (f16, bf16, f32; f32 rounded to tf32 first when the op asks)
//! are widened to f64 once per `dot` into stack arrays, where every product
//! is exact; each output element sums its products over the K tile in order
//! of `k`, from `0.0`, in f64 (an FMA of an exact product is the add of the
//! interpreter's separate multiply), then adds the f32 accumulator in f64
//! and rounds to f32 once. The micro-kernel keeps an `MR x NR` block of
//! sums in registers (`MR = 4` rows, `NR` = a strip of f64 columns) over the
//! whole K loop, so each `b` row loaded feeds `MR` FMAs and each broadcast
//! `a` element `NR` of them; the summation order of an element does not
//! depend on the blocking.
//!
//! i8 inputs with an i32 accumulator: exact integer products, wrapping sums
//! (the interpreter reports i32 overflow), in any order.

use super::eval::Idx;
use super::{Lower, Repr};
use crate::Result;
use crate::llvm::Values;
use dsl_core::ir::Inst;
use dsl_core::ir::ops::{DotPrecision, Op};
use dsl_core::{DType, Elem};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, InstructionOpcode::*, PointerValue};

/// Output rows of the micro-kernel block.
const MR: usize = 4;

impl<'ctx> Lower<'ctx, '_> {
    /// `dot a, b, acc`.
    pub(super) fn lower_dot(&mut self, i: Inst) -> Result<()> {
        let f = self.f;
        let d = &f.insts[i];
        let Op::Dot(op) = d.op else { return Err(self.unsupported(i, "not a dot")) };
        let (a, b, acc) = (d.args[0], d.args[1], d.args[2]);
        let (at, bt) = (f.ty(a).clone(), f.ty(b).clone());
        let (m, k, n) = (at.shape[0], at.shape[1], bt.shape[1]);
        let Elem::Scalar(dt) = at.elem else { return Err(self.unsupported(i, "a dot of pointers")) };
        let int = dt == DType::I8;
        if !int && !matches!(dt, DType::F16 | DType::BF16 | DType::F32) {
            return Err(self.unsupported(i, format!("a dot of {dt}")));
        }
        let tf32 = op.precision == DotPrecision::Tf32 && dt == DType::F32;
        let wide: BasicTypeEnum<'ctx> =
            if int { self.ctx.i32_type().into() } else { self.ctx.f64_type().into() };
        let wide_elem = if int { Elem::Scalar(DType::I32) } else { Elem::Scalar(DType::F64) };
        let aw = self.widen_operand(a, m * k, wide_elem, wide, tf32)?;
        let bw = self.widen_operand(b, k * n, wide_elem, wide, tf32)?;
        let res = d.results[0];
        let rt = f.ty(res).clone();
        let out = self.alloc_array(rt.elem, m * n)?;
        let nr = (self.lanes as usize).min(n).max(1) as u32;
        let mr = MR.min(m);
        let sums: Vec<PointerValue<'ctx>> =
            (0..mr).map(|_| self.alloca(self.vec_of(wide, nr).into(), 64)).collect::<Result<_>>()?;
        let vt = self.vec_of(wide, nr);
        self.emit_loop(self.c32(0), self.c32(m as i64), mr as i64, true, |l, i0| {
            l.emit_loop(l.c32(0), l.c32(n as i64), i64::from(nr), true, |l, j0| {
                for &s in &sums {
                    l.b.build_store(s, vt.const_zero())?;
                }
                l.emit_loop(l.c32(0), l.c32(k as i64), 1, true, |l, kk| {
                    let brow = l.b.build_int_add(l.b.build_int_mul(kk, l.c32(n as i64), "")?, j0, "")?;
                    let bv = l.load_strip(wide_elem, bw, brow, nr)?;
                    for (r, &s) in sums.iter().enumerate() {
                        let row = l.b.build_int_add(i0, l.c32(r as i64), "")?;
                        let at = l.b.build_int_add(l.b.build_int_mul(row, l.c32(k as i64), "")?, kk, "")?;
                        let av = l.splat(l.load_elem(wide_elem, aw, at)?, nr)?;
                        let cur = l.b.build_load(vt, s, "")?;
                        let next = if int {
                            l.bin(Add, cur, l.bin(Mul, av, bv)?)?
                        } else {
                            l.call1("llvm.fma", &[av, bv, cur])?
                        };
                        l.b.build_store(s, next)?;
                    }
                    Ok(())
                })?;
                l.memo.clear();
                for (r, &s) in sums.iter().enumerate() {
                    let row = l.b.build_int_add(i0, l.c32(r as i64), "")?;
                    let at = l.b.build_int_add(l.b.build_int_mul(row, l.c32(n as i64), "")?, j0, "")?;
                    let c = l.eval(acc, &Idx::affine(at, nr))?;
                    let sum = l.b.build_load(vt, s, "")?;
                    let o = if int {
                        l.bin(Add, c, sum)?
                    } else {
                        let c64 = l.cast_to(FPExt, c, l.ctx.f64_type().into())?;
                        let t = l.bin(FAdd, c64, sum)?;
                        l.cast_to(FPTrunc, t, l.ctx.f32_type().into())?
                    };
                    l.store_strip(rt.elem, out, at, o)?;
                }
                l.memo.clear();
                Ok(())
            })
        })?;
        self.memo.clear();
        self.set(res, Repr::Array(out));
        Ok(())
    }

    /// Tile `v` of `n` elements widened into a fresh array of `wide` (f64,
    /// or i32 for i8), rounded to tf32 first when asked.
    fn widen_operand(
        &mut self,
        v: dsl_core::ir::Value,
        n: usize,
        wide_elem: Elem,
        wide: BasicTypeEnum<'ctx>,
        tf32: bool,
    ) -> Result<PointerValue<'ctx>> {
        let arr = self.alloc_array(wide_elem, n)?;
        let int = wide_elem == Elem::Scalar(DType::I32);
        // `trans(x)` (a dequantized weight tile, say): `x` is computed in its
        // own order, where its loads are contiguous, and written transposed.
        let (src, rows, cols) = match self.transposed(v) {
            Some((x, r, c)) => (x, r, c),
            None => (v, 0, 0),
        };
        let lanes = self.lanes.min(n as u32).max(1).min(if rows > 0 { cols as u32 } else { u32::MAX });
        self.emit_loop(self.c32(0), self.c32(n as i64), i64::from(lanes), true, |l, base| {
            l.memo.clear();
            let x = l.eval(src, &Idx::affine(base, lanes))?;
            let x = if tf32 { l.round_tf32(x)? } else { x };
            let w = if int { l.cast_to(SExt, x, wide)? } else { l.cast_to(FPExt, x, wide)? };
            if rows == 0 {
                return l.store_strip(wide_elem, arr, base, w);
            }
            // Element (r, c) of `x` is element (c, r) of `v`.
            let r = l.b.build_right_shift(base, l.c32(cols.trailing_zeros() as i64), false, "")?;
            let c0 = l.b.build_and(base, l.c32(cols as i64 - 1), "")?;
            for k in 0..lanes {
                let c = l.b.build_int_add(c0, l.c32(i64::from(k)), "")?;
                let at = l.b.build_int_add(l.b.build_int_mul(c, l.c32(rows as i64), "")?, r, "")?;
                let e = l.lane(w, k)?;
                l.store_strip(wide_elem, arr, at, l.splat(e, 1)?)?;
            }
            Ok(())
        })?;
        self.memo.clear();
        Ok(arr)
    }

    /// When `v` is an inline `permute [1, 0]` of a 2-D tile `x`: `x` and its
    /// shape `(rows, cols)`.
    fn transposed(&self, v: dsl_core::ir::Value) -> Option<(dsl_core::ir::Value, usize, usize)> {
        if !matches!(self.get(v), Ok(super::Repr::Inline)) {
            return None;
        }
        let i = self.f.def_inst(v)?;
        let d = &self.f.insts[i];
        match &d.op {
            Op::Shape(dsl_core::ir::ops::ShapeOp::Permute { order }) if order.as_slice() == [1, 0] => {
                let x = d.args[0];
                let s = &self.f.ty(x).shape;
                Some((x, s[0], s[1]))
            }
            _ => None,
        }
    }

    /// `x` (f32) rounded to tf32: 10 significand bits, ties away from zero
    /// (`cvt.rna.tf32.f32`); infinities and NaNs unchanged.
    fn round_tf32(&self, x: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let i32t: BasicTypeEnum<'ctx> = self.ctx.i32_type().into();
        let bits = self.cast_to(BitCast, x, i32t)?;
        let r = self.bin(
            And,
            self.bin(Add, bits, self.int_like(bits, 1 << 12)?)?,
            self.int_like(bits, !0x1fff_u32 as u64)?,
        )?;
        let r = self.cast_to(BitCast, r, self.ctx.f32_type().into())?;
        let ax = self.call1("llvm.fabs", &[x])?;
        let finite = self.fcmp(inkwell::FloatPredicate::OLT, ax, self.float_like(x, f64::INFINITY)?)?;
        self.select(finite, r, x)
    }
}
