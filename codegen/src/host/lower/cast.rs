//! Casts: numeric conversions, bitcasts and pointer casts, with the
//! interpreter's semantics (`dsl_core::interp`, cast.rs): to a float rounds
//! to nearest even once (integers to f16/bf16 through f64, f64 to the
//! halves through round-to-odd, see `math.rs`); float to integer truncates
//! toward zero and saturates, NaN becoming 0 (`llvm.fptosi.sat`); integer
//! to integer extends by the source's signedness or truncates; to `i1` is
//! `!= 0` (unordered for floats: NaN gives true); bitcasts go through the
//! raw bits (f16/bf16 through their 16-bit patterns).

use super::Lower;
use crate::Result;
use crate::llvm::Values;
use dsl_core::ir::Inst;
use dsl_core::ir::ops::CastOp;
use dsl_core::{DType, Elem};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, InstructionOpcode::*};
use inkwell::{FloatPredicate, IntPredicate};

impl<'ctx> Lower<'ctx, '_> {
    /// `cast`/`bitcast`/`ptrcast` of `a` (of `from`).
    pub(super) fn cast(
        &self,
        i: Inst,
        c: CastOp,
        from: Elem,
        a: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        match c {
            CastOp::PtrCast { .. } => Ok(a),
            CastOp::Cast { to } => match from {
                Elem::Scalar(f) => self.convert(f, to, a),
                Elem::Ptr(_) => Err(self.unsupported(i, "a numeric cast of a pointer")),
            },
            CastOp::Bitcast { to } => match from {
                Elem::Scalar(f) => self.bitcast(i, f, to, a),
                Elem::Ptr(_) => Err(self.unsupported(i, "a bitcast of a pointer")),
            },
        }
    }

    /// Numeric conversion from `from` to `to`.
    pub(super) fn convert(
        &self,
        from: DType,
        to: DType,
        a: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        if from == to {
            return Ok(a);
        }
        let to_ty = self.reg_elem(Elem::Scalar(to));
        let f64t: BasicTypeEnum<'ctx> = self.ctx.f64_type().into();
        if from.is_int() {
            let signed = from.is_signed_int();
            return match to {
                DType::I1 => self.icmp(IntPredicate::NE, a, self.int_like(a, 0)?),
                DType::F32 | DType::F64 => self.cast_to(if signed { SIToFP } else { UIToFP }, a, to_ty),
                DType::F16 | DType::BF16 => {
                    let x = self.cast_to(if signed { SIToFP } else { UIToFP }, a, f64t)?;
                    self.narrow(to, x)
                }
                _ => {
                    let (fb, tb) = (from.bits(), to.bits());
                    if tb < fb {
                        self.cast_to(Trunc, a, to_ty)
                    } else if tb > fb {
                        self.cast_to(if signed { SExt } else { ZExt }, a, to_ty)
                    } else {
                        Ok(a)
                    }
                }
            };
        }
        // From a float.
        match to {
            // From f16, bf16, f32 or the other 8-bit float: exact f32 values.
            DType::F8E4M3 | DType::F8E5M2 => self.round_f8(to, a),
            DType::I1 => self.fcmp(FloatPredicate::UNE, a, self.float_like(a, 0.0)?),
            d if d.is_int() => {
                let name = if d.is_signed_int() { "llvm.fptosi.sat" } else { "llvm.fptoui.sat" };
                let ret = self.like(a, to_ty);
                self.intrinsic(name, &[ret, a.get_type()], &[a])?
                    .ok_or_else(|| crate::Error::Llvm(format!("`{name}` returned no value")))
            }
            DType::F64 => self.cast_to(FPExt, a, f64t),
            DType::F32 => {
                if from == DType::F64 {
                    self.cast_to(FPTrunc, a, to_ty)
                } else {
                    // f16/bf16 values are exact f32 values.
                    Ok(a)
                }
            }
            DType::F16 | DType::BF16 => {
                if from == DType::F64 {
                    self.narrow(to, a)
                } else {
                    self.round_half(to, a)
                }
            }
            _ => Ok(a),
        }
    }

    /// `bitcast` of `a` from `from` to `to` (the same width).
    fn bitcast(
        &self,
        i: Inst,
        from: DType,
        to: DType,
        a: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        if from == to {
            return Ok(a);
        }
        let bits_ty: BasicTypeEnum<'ctx> = self.int_type(from.bits()).into();
        let raw = match from {
            DType::F16 | DType::BF16 => self.f32_to_half_bits(from, a)?,
            DType::F8E4M3 | DType::F8E5M2 => self.f32_to_f8_bits(from, a)?,
            DType::F32 | DType::F64 => self.cast_to(BitCast, a, bits_ty)?,
            DType::I1 => return Err(self.unsupported(i, "a bitcast of i1")),
            _ => a,
        };
        match to {
            DType::F16 | DType::BF16 => self.half_bits_to_f32(to, raw),
            DType::F8E4M3 | DType::F8E5M2 => self.f8_bits_to_f32(to, raw),
            DType::F32 | DType::F64 => self.cast_to(BitCast, raw, self.reg_elem(Elem::Scalar(to))),
            DType::I1 => Err(self.unsupported(i, "a bitcast to i1")),
            _ => Ok(raw),
        }
    }
}
