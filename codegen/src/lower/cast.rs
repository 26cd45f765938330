//! Casts: numeric conversions, bitcasts and pointer casts, register by register.
//!
//! Semantics (`dsl_core::ir::ops::cast`): to a float rounds to nearest even
//! (`sitofp`/`uitofp`/`fptrunc`); float to integer truncates toward zero and
//! saturates with NaN -> 0 (`llvm.fpto{s,u}i.sat`, after an exact widening of
//! halves to f32); integer to integer extends by the source's signedness or
//! truncates; to `i1` is an unordered `!= 0`. `ptrcast` moves no bits (opaque
//! pointers). Caveat: a 64-bit or >2^24 integer converted to f16/bf16 may be
//! rounded twice by the backend's promotion through f32.

use super::{Lowerer, reg_type};
use crate::Result;
use dsl_core::dtype::{DType, Elem};
use dsl_core::ir::Inst;
use dsl_core::ir::ops::CastOp;
use inkwell::values::BasicValueEnum;
use inkwell::{FloatPredicate, IntPredicate};

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// Converts one register of dtype `from` to dtype `to`.
    pub fn convert(&self, v: BasicValueEnum<'ctx>, from: DType, to: DType) -> Result<BasicValueEnum<'ctx>> {
        if from == to {
            return Ok(v);
        }
        let b = &self.b;
        let tt = reg_type(self.ctx, Elem::Scalar(to));
        Ok(match (from.is_float(), to.is_float()) {
            (false, false) => {
                let x = v.into_int_value();
                if to == DType::I1 {
                    b.build_int_compare(IntPredicate::NE, x, x.get_type().const_zero(), "")?.into()
                } else {
                    b.build_int_cast_sign_flag(x, tt.into_int_type(), from.is_signed_int(), "")?.into()
                }
            }
            (false, true) => {
                let x = v.into_int_value();
                let ft = tt.into_float_type();
                if from.is_signed_int() {
                    b.build_signed_int_to_float(x, ft, "")?.into()
                } else {
                    b.build_unsigned_int_to_float(x, ft, "")?.into()
                }
            }
            (true, true) => {
                let x = v.into_float_value();
                let ft = tt.into_float_type();
                if from.bits() < to.bits() {
                    b.build_float_ext(x, ft, "")?.into()
                } else if from.bits() > to.bits() {
                    b.build_float_trunc(x, ft, "")?.into()
                } else {
                    // f16 <-> bf16: exact through f32, one rounding at the end.
                    let w = b.build_float_ext(x, self.ctx.f32_type(), "")?;
                    b.build_float_trunc(w, ft, "")?.into()
                }
            }
            (true, false) => {
                let x = self.fwiden(v, from)?;
                if to == DType::I1 {
                    let z = x.get_type().const_zero();
                    b.build_float_compare(FloatPredicate::UNE, x, z, "")?.into()
                } else {
                    let fs = if x.get_type() == self.ctx.f64_type() { "f64" } else { "f32" };
                    let kind = if to.is_signed_int() { "fptosi" } else { "fptoui" };
                    let name = format!("llvm.{kind}.sat.i{}.{fs}", to.bits());
                    self.call1(&name, tt, &[x.into()])?
                }
            }
        })
    }

    pub(super) fn lower_cast(&mut self, inst: Inst, op: CastOp) -> Result<()> {
        let a = self.args(inst)[0];
        let res = self.result(inst, 0)?;
        let from = self.f.ty(a).dtype();
        let regs = self.regs(a)?;
        let out = match op {
            CastOp::PtrCast { .. } => regs,
            CastOp::Cast { to } => regs.iter().map(|&v| self.convert(v, from, to)).collect::<Result<_>>()?,
            CastOp::Bitcast { to } => {
                let tt = reg_type(self.ctx, Elem::Scalar(to));
                regs.iter().map(|&v| Ok(self.b.build_bit_cast(v, tt, "")?)).collect::<Result<_>>()?
            }
        };
        self.set(res, out);
        Ok(())
    }
}
