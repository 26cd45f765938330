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
use crate::llvm::BV;
use crate::target::Target;
use dsl_core::dtype::{DType, Elem};
use dsl_core::ir::Inst;
use dsl_core::ir::ops::CastOp;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FloatValue, InstructionOpcode, IntValue};
use inkwell::{FloatPredicate, IntPredicate};

/// The PTX name of an 8-bit float format.
fn f8_ptx(d: DType) -> &'static str {
    if d == DType::F8E4M3 { "e4m3" } else { "e5m2" }
}

impl<'ctx> crate::llvm::Values<'ctx> for Lowerer<'_, 'ctx> {
    fn bin(&self, op: InstructionOpcode, a: BV<'ctx>, b: BV<'ctx>) -> Result<BV<'ctx>> {
        Ok(self.b.build_binop(op, a, b, "")?)
    }
    fn icmp(&self, p: IntPredicate, a: BV<'ctx>, b: BV<'ctx>) -> Result<BV<'ctx>> {
        Ok(self.b.build_int_compare(p, a.into_int_value(), b.into_int_value(), "")?.into())
    }
    fn select(&self, c: BV<'ctx>, a: BV<'ctx>, b: BV<'ctx>) -> Result<BV<'ctx>> {
        Ok(self.b.build_select(c.into_int_value(), a, b, "")?)
    }
    fn int_like(&self, v: BV<'ctx>, c: u64) -> Result<BV<'ctx>> {
        Ok(v.into_int_value().get_type().const_int(c, false).into())
    }
    fn float_like(&self, v: BV<'ctx>, c: f64) -> Result<BV<'ctx>> {
        Ok(v.into_float_value().get_type().const_float(c).into())
    }
    fn cast_to(&self, op: InstructionOpcode, v: BV<'ctx>, to: BasicTypeEnum<'ctx>) -> Result<BV<'ctx>> {
        Ok(self.b.build_cast(op, v, to, "")?)
    }
    fn context(&self) -> &'ctx inkwell::context::Context {
        self.ctx
    }
}

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// Converts one register of dtype `from` to dtype `to`.
    pub fn convert(&self, v: BasicValueEnum<'ctx>, from: DType, to: DType) -> Result<BasicValueEnum<'ctx>> {
        if from == to {
            return Ok(v);
        }
        if from.is_f8() || to.is_f8() {
            return self.convert_f8(v, from, to);
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

    /// A conversion to or from an 8-bit float (the other side f16, bf16,
    /// f32 or an 8-bit float; an 8-bit float register holds its code): the
    /// source widened exactly to f32, then one rounding to the target. On
    /// sm_90a the hardware converts (`cvt.rn.f16x2.{e4m3x2,e5m2x2}` decodes
    /// exactly, `cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32` rounds); elsewhere
    /// the shared integer code of [`crate::llvm`] does the same.
    fn convert_f8(&self, v: BasicValueEnum<'ctx>, from: DType, to: DType) -> Result<BasicValueEnum<'ctx>> {
        let (i16t, i32t, f32t) = (self.ctx.i16_type(), self.ctx.i32_type(), self.ctx.f32_type());
        let hw = self.opts.target == Target::Sm90a;
        let x = if from.is_f8() {
            if hw {
                let code = self.b.build_int_z_extend(v.into_int_value(), i16t, "")?;
                self.f8x2_to_f32(code, from, 1)?[0].into()
            } else {
                let code = self.b.build_int_z_extend(v.into_int_value(), i32t, "")?;
                crate::llvm::f8_code_to_f32(self, code.into(), from)?
            }
        } else {
            self.fwiden(v, from)?.into()
        };
        if !to.is_f8() {
            // An 8-bit float's value is exact in f16, bf16 and f32.
            return self.fnarrow(x.into_float_value(), to);
        }
        let code = if hw {
            let asm = format!("cvt.rn.satfinite.{}x2.f32 $0, $1, $2;", f8_ptx(to));
            let zero = f32t.const_zero().into();
            self.asm_value(&asm, "=h,f,f", i16t.into(), &[zero, x], false)?.into_int_value()
        } else {
            crate::llvm::f32_to_f8_code(self, x, to)?.into_int_value()
        };
        Ok(self.b.build_int_truncate(code, self.ctx.i8_type(), "")?.into())
    }

    /// [`Self::convert_f8`] from an 8-bit float on sm_90a, two registers a
    /// `cvt.rn.f16x2.{e4m3x2,e5m2x2}`: the codes of each pair of registers
    /// packed low and high, their exact f16 values in the low and high
    /// halves, each value then widened to f32 and rounded once to `to`. The
    /// same values as one conversion a register, half the conversions.
    fn decode_f8_pairs(
        &self,
        regs: &[BasicValueEnum<'ctx>],
        from: DType,
        to: DType,
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let (b, i16t) = (&self.b, self.ctx.i16_type());
        let mut out = Vec::with_capacity(regs.len());
        for pair in regs.chunks(2) {
            let lo = b.build_int_z_extend(pair[0].into_int_value(), i16t, "")?;
            let code = match pair.get(1) {
                Some(h) => {
                    let hi = b.build_int_z_extend(h.into_int_value(), i16t, "")?;
                    b.build_or(lo, b.build_left_shift(hi, i16t.const_int(8, false), "")?, "")?
                }
                None => lo,
            };
            for x in self.f8x2_to_f32(code, from, pair.len())? {
                out.push(self.fnarrow(x, to)?);
            }
        }
        Ok(out)
    }

    /// The f32 values of the first `n` (1 or 2) of the two 8-bit float
    /// codes packed low and high in `code` (i16), by one
    /// `cvt.rn.f16x2.{e4m3x2,e5m2x2}` (sm_90a; exact through f16).
    fn f8x2_to_f32(&self, code: IntValue<'ctx>, from: DType, n: usize) -> Result<Vec<FloatValue<'ctx>>> {
        let (b, i16t, i32t) = (&self.b, self.ctx.i16_type(), self.ctx.i32_type());
        let asm = format!("cvt.rn.f16x2.{}x2 $0, $1;", f8_ptx(from));
        let halves = self.asm_value(&asm, "=r,h", i32t.into(), &[code.into()], false)?.into_int_value();
        (0..n as u64)
            .map(|k| {
                let bits = if k == 0 {
                    halves
                } else {
                    b.build_right_shift(halves, i32t.const_int(16, false), false, "")?
                };
                let h = b.build_bit_cast(b.build_int_truncate(bits, i16t, "")?, self.ctx.f16_type(), "")?;
                Ok(b.build_float_ext(h.into_float_value(), self.ctx.f32_type(), "")?)
            })
            .collect()
    }

    pub(super) fn lower_cast(&mut self, inst: Inst, op: CastOp) -> Result<()> {
        let a = self.args(inst)[0];
        let res = self.result(inst, 0)?;
        let from = self.f.ty(a).dtype();
        let regs = self.regs(a)?;
        let out = match op {
            CastOp::PtrCast { .. } => regs,
            CastOp::Cast { to }
                if from.is_f8() && to.is_float() && !to.is_f8() && self.opts.target == Target::Sm90a =>
            {
                self.decode_f8_pairs(&regs, from, to)?
            }
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
