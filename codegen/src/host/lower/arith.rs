//! Elementwise ops on scalars and strips alike: arithmetic and math,
//! `fma`, `dp4a`, `addptr`, comparisons, `select`, and constants. The
//! semantics are the interpreter's (`dsl_core::interp`, arith.rs):
//!
//! - integers wrap (the interpreter reports signed overflow; compiled code
//!   never traps): a zero divisor is replaced by one, and `x / -1` is `-x`,
//!   so no division faults; shift amounts at or beyond the width (or
//!   negative) shift everything out (`shr` of a signed value fills with
//!   its sign);
//! - f32, f16 and bf16 values are computed in f32 and rounded to their
//!   dtype after every op; transcendentals, `pow`, `sqrt`, `rsqrt` and
//!   `sigmoid` in f64 with one rounding; `fma` of halves in f64;
//! - float `min`/`max` return the non-NaN operand (`llvm.minnum` /
//!   `llvm.maxnum`, what Rust's `f32::min` compiles to);
//! - comparisons of floats are ordered, `ne` unordered.

use super::Lower;
use crate::llvm::{Values, float_predicate, int_order, int_predicate};
use crate::{Error, Result};
use dsl_core::ir::ops::{ArithOp, BinaryOp, CmpPred, CompareOp, Op, UnaryOp};
use dsl_core::ir::{Inst, Scalar};
use dsl_core::{DType, Elem};
use inkwell::IntPredicate;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, InstructionOpcode::*};

impl<'ctx> Lower<'ctx, '_> {
    /// The constant `s` as a scalar, or splat over `lanes`.
    pub(super) fn constant(&self, s: Scalar, lanes: Option<u32>) -> Result<BasicValueEnum<'ctx>> {
        let ty = self.reg_elem(Elem::Scalar(s.dtype()));
        let v = self.const_scalar(ty, s.as_f64(), s.as_i64() as u64);
        match lanes {
            None => Ok(v),
            Some(n) => self.splat(v, n),
        }
    }

    /// The results of the pure elementwise instruction `i` on operand
    /// values `args` (all scalars, or all strips of one width).
    pub(super) fn elementwise(
        &self,
        i: Inst,
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let f = self.f;
        let d = &f.insts[i];
        let ty = |k: usize| f.ty(d.args[k]).elem;
        let arg = |k: usize| args.get(k).copied().ok_or_else(|| self.unsupported(i, "missing operand"));
        let out = match &d.op {
            Op::Arith(ArithOp::Binary(op)) => self.binary(i, *op, ty(0), arg(0)?, arg(1)?)?,
            Op::Arith(ArithOp::Unary(op)) => self.unary(i, *op, ty(0), arg(0)?)?,
            Op::Arith(ArithOp::Fma) => self.fma(ty(0), arg(0)?, arg(1)?, arg(2)?)?,
            Op::Arith(ArithOp::Dp4a) => self.dp4a(ty(0), ty(1), ty(2), arg(0)?, arg(1)?, arg(2)?)?,
            Op::Arith(ArithOp::AddPtr) => {
                let size = f.ty(d.args[0]).dtype().size_bytes() as u64;
                let off = self.widen_i64(ty(1), arg(1)?)?;
                let bytes = self.bin(Mul, off, self.int_like(off, size)?)?;
                self.bin(Add, arg(0)?, bytes)?
            }
            Op::Compare(CompareOp::Cmp(p)) => self.compare(*p, ty(0), arg(0)?, arg(1)?)?,
            Op::Compare(CompareOp::Select) => self.select(arg(0)?, arg(1)?, arg(2)?)?,
            Op::Cast(c) => self.cast(i, *c, ty(0), arg(0)?)?,
            Op::Hint(_) => arg(0)?,
            _ => return Err(self.unsupported(i, "not an elementwise op")),
        };
        Ok(vec![out])
    }

    /// An integer of `elem` (or an address) widened to `i64` by its
    /// signedness.
    pub(super) fn widen_i64(&self, elem: Elem, v: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let i64t: BasicTypeEnum<'ctx> = self.ctx.i64_type().into();
        match elem {
            Elem::Ptr(_) | Elem::Scalar(DType::I64) => Ok(v),
            Elem::Scalar(d) if d.is_signed_int() => self.cast_to(SExt, v, i64t),
            Elem::Scalar(_) => self.cast_to(ZExt, v, i64t),
        }
    }

    /// `a op b`.
    fn binary(
        &self,
        i: Inst,
        op: BinaryOp,
        elem: Elem,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let Elem::Scalar(d) = elem else { return Err(self.unsupported(i, "arithmetic on pointers")) };
        if d.is_float() {
            return self.float_binary(i, op, d, a, b);
        }
        let signed = d.is_signed_int();
        let bits = u64::from(d.bits());
        let zero = self.int_like(a, 0)?;
        let one = self.int_like(a, 1)?;
        Ok(match op {
            BinaryOp::Add => self.bin(Add, a, b)?,
            BinaryOp::Sub => self.bin(Sub, a, b)?,
            BinaryOp::Mul => self.bin(Mul, a, b)?,
            BinaryOp::Div | BinaryOp::Rem => {
                let by0 = self.icmp(IntPredicate::EQ, b, zero)?;
                let minus1 = if signed && bits > 1 {
                    self.icmp(IntPredicate::EQ, b, self.int_like(a, u64::MAX)?)?
                } else {
                    self.int_like(by0, 0)?
                };
                let unsafe_div = self.bin(Or, by0, minus1)?;
                let safe_b = self.select(unsafe_div, one, b)?;
                if op == BinaryOp::Div {
                    let q = self.bin(if signed { SDiv } else { UDiv }, a, safe_b)?;
                    // `x / -1` is `-x` (wrapping), computed without `sdiv`.
                    let neg = self.bin(Sub, zero, a)?;
                    self.select(minus1, neg, q)?
                } else {
                    // `x % -1` is 0 = `x % 1`; `x % 0` is an interpreter error.
                    self.bin(if signed { SRem } else { URem }, a, safe_b)?
                }
            }
            BinaryOp::Min | BinaryOp::Max => {
                // `a` stays when it beats `b`.
                let c = self.icmp(int_order(op == BinaryOp::Max, signed), a, b)?;
                self.select(c, a, b)?
            }
            BinaryOp::And => self.bin(And, a, b)?,
            BinaryOp::Or => self.bin(Or, a, b)?,
            BinaryOp::Xor => self.bin(Xor, a, b)?,
            BinaryOp::Shl | BinaryOp::Shr => {
                // Amounts count as unsigned: negative ones are huge.
                let big = self.icmp(IntPredicate::UGE, b, self.int_like(a, bits)?)?;
                if op == BinaryOp::Shl {
                    let s = self.select(big, zero, b)?;
                    let r = self.bin(Shl, a, s)?;
                    self.select(big, zero, r)?
                } else if signed {
                    let s = self.select(big, self.int_like(a, bits - 1)?, b)?;
                    self.bin(AShr, a, s)?
                } else {
                    let s = self.select(big, zero, b)?;
                    let r = self.bin(LShr, a, s)?;
                    self.select(big, zero, r)?
                }
            }
            BinaryOp::MulHi => {
                let wide: BasicTypeEnum<'ctx> = self.int_type(2 * bits as u32).into();
                let ext = if signed { SExt } else { ZExt };
                let (x, y) = (self.cast_to(ext, a, wide)?, self.cast_to(ext, b, wide)?);
                let p = self.bin(Mul, x, y)?;
                let hi = self.bin(if signed { AShr } else { LShr }, p, self.int_like(p, bits)?)?;
                self.cast_to(Trunc, hi, self.reg_elem(elem))?
            }
            BinaryOp::Pow => return Err(self.unsupported(i, format!("`pow` on {d}"))),
        })
    }

    /// `a op b` on floats of dtype `d`.
    fn float_binary(
        &self,
        i: Inst,
        op: BinaryOp,
        d: DType,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        if op == BinaryOp::Pow {
            if d == DType::F64 {
                return self.call1("llvm.pow", &[a, b]);
            }
            let f64t: BasicTypeEnum<'ctx> = self.ctx.f64_type().into();
            let (x, y) = (self.cast_to(FPExt, a, f64t)?, self.cast_to(FPExt, b, f64t)?);
            let p = self.call1("llvm.pow", &[x, y])?;
            return self.narrow(d, p);
        }
        let r = match op {
            BinaryOp::Add => self.bin(FAdd, a, b)?,
            BinaryOp::Sub => self.bin(FSub, a, b)?,
            BinaryOp::Mul => self.bin(FMul, a, b)?,
            BinaryOp::Div => self.bin(FDiv, a, b)?,
            BinaryOp::Rem => self.bin(FRem, a, b)?,
            BinaryOp::Min => self.call1("llvm.minnum", &[a, b])?,
            BinaryOp::Max => self.call1("llvm.maxnum", &[a, b])?,
            _ => return Err(self.unsupported(i, format!("`{}` on floats", op.name()))),
        };
        self.round_half(d, r)
    }

    /// `op a`.
    fn unary(
        &self,
        i: Inst,
        op: UnaryOp,
        elem: Elem,
        a: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let Elem::Scalar(d) = elem else { return Err(self.unsupported(i, "arithmetic on pointers")) };
        if d.is_int() {
            return Ok(match op {
                UnaryOp::Neg => self.bin(Sub, self.int_like(a, 0)?, a)?,
                UnaryOp::Not => self.bin(Xor, a, self.int_like(a, u64::MAX)?)?,
                UnaryOp::Abs => {
                    let f = self.ctx.bool_type().const_zero().into();
                    self.call1("llvm.abs", &[a, f])?
                }
                _ => return Err(self.unsupported(i, format!("`{}` on {d}", op.name()))),
            });
        }
        match op {
            UnaryOp::Neg => return self.fneg(a),
            UnaryOp::Abs => return self.call1("llvm.fabs", &[a]),
            UnaryOp::Floor => return self.call1("llvm.floor", &[a]),
            UnaryOp::Ceil => return self.call1("llvm.ceil", &[a]),
            UnaryOp::Not => return Err(self.unsupported(i, format!("`not` on {d}"))),
            _ => {}
        }
        let f64t: BasicTypeEnum<'ctx> = self.ctx.f64_type().into();
        let x = if d == DType::F64 { a } else { self.cast_to(FPExt, a, f64t)? };
        let y = match op {
            // f32/f16/bf16 results: the vector exponentials (see `math.rs`).
            UnaryOp::Exp if d != DType::F64 => self.exp_f64(x, false)?,
            UnaryOp::Exp2 if d != DType::F64 => self.exp_f64(x, true)?,
            UnaryOp::Exp => self.libm("llvm.exp", x)?,
            UnaryOp::Exp2 => self.libm("llvm.exp2", x)?,
            UnaryOp::Log => self.libm("llvm.log", x)?,
            UnaryOp::Log2 => self.libm("llvm.log2", x)?,
            UnaryOp::Sqrt => self.call1("llvm.sqrt", &[x])?,
            UnaryOp::Rsqrt => {
                let s = self.call1("llvm.sqrt", &[x])?;
                self.bin(FDiv, self.float_like(s, 1.0)?, s)?
            }
            UnaryOp::Sin => self.libm("llvm.sin", x)?,
            UnaryOp::Cos => self.libm("llvm.cos", x)?,
            UnaryOp::Tanh => self.libm("llvm.tanh", x)?,
            UnaryOp::Sigmoid => {
                let neg = self.fneg(x)?;
                let e = if d == DType::F64 { self.libm("llvm.exp", neg)? } else { self.exp_f64(neg, false)? };
                let den = self.bin(FAdd, self.float_like(e, 1.0)?, e)?;
                self.bin(FDiv, self.float_like(den, 1.0)?, den)?
            }
            UnaryOp::Erf => self.libm("erf", x)?,
            _ => return Err(self.unsupported(i, format!("`{}` on {d}", op.name()))),
        };
        if d == DType::F64 { Ok(y) } else { self.narrow(d, y) }
    }

    /// `-a` for floats (the sign bit flipped, NaNs included).
    pub(super) fn fneg(&self, a: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        Ok(match a {
            BasicValueEnum::FloatValue(x) => self.b.build_float_neg(x, "")?.into(),
            BasicValueEnum::VectorValue(x) => self.b.build_float_neg(x, "")?.into(),
            _ => return Err(Error::Llvm("host lowering: a float op on a non-float".into())),
        })
    }

    /// `a * b + c` with one rounding.
    fn fma(
        &self,
        elem: Elem,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        c: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        match elem {
            Elem::Scalar(DType::F32 | DType::F64) => self.call1("llvm.fma", &[a, b, c]),
            Elem::Scalar(d @ (DType::F16 | DType::BF16)) => {
                let f64t: BasicTypeEnum<'ctx> = self.ctx.f64_type().into();
                let (x, y, z) = (
                    self.cast_to(FPExt, a, f64t)?,
                    self.cast_to(FPExt, b, f64t)?,
                    self.cast_to(FPExt, c, f64t)?,
                );
                let r = self.call1("llvm.fma", &[x, y, z])?;
                self.narrow(d, r)
            }
            _ => Err(Error::Llvm("host lowering: `fma` on a non-float".into())),
        }
    }

    /// `c + sum_{k<4} byte_k(a) * byte_k(b)` (bytes signed for `i32`
    /// operands), wrapping.
    #[allow(clippy::too_many_arguments)]
    fn dp4a(
        &self,
        ta: Elem,
        tb: Elem,
        _tc: Elem,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        c: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let i32t: BasicTypeEnum<'ctx> = self.ctx.i32_type().into();
        let i8t: BasicTypeEnum<'ctx> = self.ctx.i8_type().into();
        let byte = |w: BasicValueEnum<'ctx>, k: u64, signed: bool| -> Result<BasicValueEnum<'ctx>> {
            let s = self.bin(LShr, w, self.int_like(w, 8 * k)?)?;
            let t = self.cast_to(Trunc, s, i8t)?;
            self.cast_to(if signed { SExt } else { ZExt }, t, i32t)
        };
        let (sa, sb) = (ta == Elem::Scalar(DType::I32), tb == Elem::Scalar(DType::I32));
        let mut acc = c;
        for k in 0..4 {
            let p = self.bin(Mul, byte(a, k, sa)?, byte(b, k, sb)?)?;
            acc = self.bin(Add, acc, p)?;
        }
        Ok(acc)
    }

    /// `cmp pred a, b` for operands of `elem`.
    fn compare(
        &self,
        p: CmpPred,
        elem: Elem,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let float = matches!(elem, Elem::Scalar(d) if d.is_float());
        if float {
            return self.fcmp(float_predicate(p), a, b);
        }
        // Addresses compare as the interpreter's (positive) i64 addresses.
        let signed = match elem {
            Elem::Ptr(_) => true,
            Elem::Scalar(d) => d.is_signed_int(),
        };
        self.icmp(int_predicate(p, signed), a, b)
    }
}
