//! Elementwise arithmetic and math, `fma` and `addptr`, register by register.
//!
//! Numerics follow `dsl_core::ir::ops::arith` and the interpreter:
//! - f16/bf16 are computed in f32 and rounded back after every op; f32 and f64
//!   use their own precision; f32 `div` is IEEE (`div.rn`).
//! - Transcendentals use the PTX approximations: `exp(x) = ex2.approx(x*log2 e)`
//!   (`exp` and `exp2` flush subnormal results to 0: `ex2.approx.ftz`),
//!   `log(x) = lg2.approx(x) * ln 2`, `rsqrt.approx`, `sin/cos.approx`;
//!   `tanh(x) = sign(x) (1 - t)/(1 + t)` with `t = 2^(-2|x| log2 e)`;
//!   `sigmoid(x) = 1/(1 + exp(-x))`; `pow(a, b) = exp2(b * log2 a)` (NaN for
//!   negative `a`); `erf` is Abramowitz & Stegun 7.1.26 (absolute error below
//!   1.5e-7 plus the `ex2.approx` error). f64 transcendentals (other than
//!   `sqrt`, `floor`, `ceil`, `abs`, `neg`) are computed in f32 precision.
//! - Integer `div`/`rem` use `sdiv`/`udiv`/`srem`/`urem`: division by zero is
//!   undefined on the GPU (the interpreter reports it); `rem` by -1 is 0.
//! - Shift amounts are unsigned and clamped to the bit width (`shl`/logical
//!   `shr` give 0, arithmetic `shr` gives the sign fill).
//! - `mulhi` uses `mulhi` for 32/64-bit integers and a widened product otherwise.
//! - `dp4a` is `llvm.nvvm.idp4a.{s,u}.{s,u}` (PTX `dp4a`), one per register.

use super::{Lowerer, Regs, mem_type};
use crate::Result;
use dsl_core::dtype::{DType, Elem};
use dsl_core::ir::Inst;
use dsl_core::ir::ops::{ArithOp, BinaryOp, UnaryOp};
use inkwell::IntPredicate;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FloatValue, IntValue};

const LOG2E: f64 = std::f64::consts::LOG2_E;
const LN2: f64 = std::f64::consts::LN_2;

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// Widens a half/bfloat to f32 (other floats are returned unchanged).
    pub fn fwiden(&self, v: BasicValueEnum<'ctx>, d: DType) -> Result<FloatValue<'ctx>> {
        let v = v.into_float_value();
        Ok(match d {
            DType::F16 | DType::BF16 => self.b.build_float_ext(v, self.ctx.f32_type(), "")?,
            _ => v,
        })
    }

    /// Rounds an f32 computed value back to a half/bfloat `d`.
    pub fn fnarrow(&self, v: FloatValue<'ctx>, d: DType) -> Result<BasicValueEnum<'ctx>> {
        Ok(match d {
            DType::F16 => self.b.build_float_trunc(v, self.ctx.f16_type(), "")?.into(),
            DType::BF16 => self.b.build_float_trunc(v, self.ctx.bf16_type(), "")?.into(),
            _ => v.into(),
        })
    }

    /// An f32 or f64 constant matching `like`.
    fn fconst(&self, like: FloatValue<'ctx>, v: f64) -> FloatValue<'ctx> {
        like.get_type().const_float(v)
    }

    /// Calls a float intrinsic `llvm.{name}.{f32|f64}` on `args` (all of `like`'s type).
    pub fn fintr(&self, name: &str, args: &[FloatValue<'ctx>]) -> Result<FloatValue<'ctx>> {
        let ty = args[0].get_type();
        let suffix = if ty == self.ctx.f64_type() { "f64" } else { "f32" };
        let a: Vec<BasicValueEnum<'ctx>> = args.iter().map(|&x| x.into()).collect();
        Ok(self.call1(&format!("llvm.{name}.{suffix}"), ty.into(), &a)?.into_float_value())
    }

    /// Calls an f32 NVVM intrinsic (converting f64 operands to f32 and back).
    fn nvvm_f32(&self, name: &str, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        let f32t = self.ctx.f32_type();
        let is64 = x.get_type() == self.ctx.f64_type();
        let xi = if is64 { self.b.build_float_trunc(x, f32t, "")? } else { x };
        let r = self.call1(name, f32t.into(), &[xi.into()])?.into_float_value();
        Ok(if is64 { self.b.build_float_ext(r, self.ctx.f64_type(), "")? } else { r })
    }

    /// 2^x through `ex2.approx.ftz` (as Triton's `exp2`): results below 2^-126
    /// are 0 and subnormal inputs count as 0. Without `.ftz` ptxas wraps
    /// every `MUFU.EX2` in a range test and two predicated multiplies, three
    /// more instructions per exponential (a fifth of FlashAttention's key
    /// loop at head dim 128).
    pub fn exp2f(&self, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.nvvm_f32("llvm.nvvm.ex2.approx.ftz.f32", x)
    }

    /// log2(x) through `lg2.approx`.
    fn log2f(&self, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        self.nvvm_f32("llvm.nvvm.lg2.approx.f", x)
    }

    /// e^x through `ex2.approx(x * log2 e)`.
    pub fn expf(&self, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        let s = self.b.build_float_mul(x, self.fconst(x, LOG2E), "")?;
        self.exp2f(s)
    }

    /// A float unary op on an f32/f64 compute value.
    fn float_unary(&self, u: UnaryOp, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        let b = &self.b;
        Ok(match u {
            UnaryOp::Neg => b.build_float_neg(x, "")?,
            UnaryOp::Abs => self.fintr("fabs", &[x])?,
            UnaryOp::Exp => self.expf(x)?,
            UnaryOp::Exp2 => self.exp2f(x)?,
            UnaryOp::Log => b.build_float_mul(self.log2f(x)?, self.fconst(x, LN2), "")?,
            UnaryOp::Log2 => self.log2f(x)?,
            UnaryOp::Sqrt => self.fintr("sqrt", &[x])?,
            UnaryOp::Rsqrt => {
                if x.get_type() == self.ctx.f64_type() {
                    b.build_float_div(self.fconst(x, 1.0), self.fintr("sqrt", &[x])?, "")?
                } else {
                    self.nvvm_f32("llvm.nvvm.rsqrt.approx.f", x)?
                }
            }
            UnaryOp::Sin => self.nvvm_f32("llvm.nvvm.sin.approx.f", x)?,
            UnaryOp::Cos => self.nvvm_f32("llvm.nvvm.cos.approx.f", x)?,
            UnaryOp::Floor => self.fintr("floor", &[x])?,
            UnaryOp::Ceil => self.fintr("ceil", &[x])?,
            UnaryOp::Tanh => {
                let ax = self.fintr("fabs", &[x])?;
                let s = b.build_float_mul(ax, self.fconst(x, -2.0 * LOG2E), "")?;
                let t = self.exp2f(s)?;
                let one = self.fconst(x, 1.0);
                let num = b.build_float_sub(one, t, "")?;
                let den = b.build_float_add(one, t, "")?;
                let y = b.build_float_div(num, den, "")?;
                self.fintr("copysign", &[y, x])?
            }
            UnaryOp::Sigmoid => {
                let e = self.expf(b.build_float_neg(x, "")?)?;
                let one = self.fconst(x, 1.0);
                b.build_float_div(one, b.build_float_add(one, e, "")?, "")?
            }
            UnaryOp::Erf => {
                let ax = self.fintr("fabs", &[x])?;
                let one = self.fconst(x, 1.0);
                let pt = b.build_float_mul(ax, self.fconst(x, 0.327_591_1), "")?;
                let t = b.build_float_div(one, b.build_float_add(one, pt, "")?, "")?;
                let coef = [1.061_405_429, -1.453_152_027, 1.421_413_741, -0.284_496_736, 0.254_829_592];
                let mut p = self.fconst(x, coef[0]);
                for c in &coef[1..] {
                    p = self.fintr("fma", &[p, t, self.fconst(x, *c)])?;
                }
                p = b.build_float_mul(p, t, "")?;
                let x2 = b.build_float_mul(ax, ax, "")?;
                let e = self.expf(b.build_float_neg(x2, "")?)?;
                let y = b.build_float_sub(one, b.build_float_mul(p, e, "")?, "")?;
                self.fintr("copysign", &[y, x])?
            }
            UnaryOp::Not => return Err(crate::Error::Invalid("`not` on a float".into())),
        })
    }

    /// A float binary op on f32/f64 compute values.
    fn float_binary(
        &self,
        op: BinaryOp,
        x: FloatValue<'ctx>,
        y: FloatValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let b = &self.b;
        Ok(match op {
            BinaryOp::Add => b.build_float_add(x, y, "")?,
            BinaryOp::Sub => b.build_float_sub(x, y, "")?,
            BinaryOp::Mul => b.build_float_mul(x, y, "")?,
            BinaryOp::Div => b.build_float_div(x, y, "")?,
            BinaryOp::Rem => b.build_float_rem(x, y, "")?,
            BinaryOp::Min => self.fintr("minnum", &[x, y])?,
            BinaryOp::Max => self.fintr("maxnum", &[x, y])?,
            BinaryOp::Pow => {
                let l = self.log2f(x)?;
                self.exp2f(b.build_float_mul(y, l, "")?)?
            }
            _ => return Err(crate::Error::Invalid(format!("`{}` on floats", op.name()))),
        })
    }

    /// An integer binary op on values of dtype `d`.
    pub fn int_binary(
        &self,
        op: BinaryOp,
        d: DType,
        x: IntValue<'ctx>,
        y: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let b = &self.b;
        let s = d.is_signed_int();
        let ty = x.get_type();
        let bits = ty.get_bit_width();
        let minmax = |name: &str| -> Result<IntValue<'ctx>> {
            let n = format!("llvm.{}{name}.i{bits}", if s { "s" } else { "u" });
            Ok(self.call1(&n, ty.into(), &[x.into(), y.into()])?.into_int_value())
        };
        Ok(match op {
            BinaryOp::Add => b.build_int_add(x, y, "")?,
            BinaryOp::Sub => b.build_int_sub(x, y, "")?,
            BinaryOp::Mul => b.build_int_mul(x, y, "")?,
            BinaryOp::Div if s => b.build_int_signed_div(x, y, "")?,
            BinaryOp::Div => b.build_int_unsigned_div(x, y, "")?,
            BinaryOp::Rem if s => {
                // `srem MIN, -1` is undefined in LLVM; any `x rem -1` is 0 = `x rem 1`.
                let m1 = b.build_int_compare(IntPredicate::EQ, y, ty.const_all_ones(), "")?;
                let y1 = b.build_select(m1, ty.const_int(1, false), y, "")?.into_int_value();
                b.build_int_signed_rem(x, y1, "")?
            }
            BinaryOp::Rem => b.build_int_unsigned_rem(x, y, "")?,
            BinaryOp::Min => minmax("min")?,
            BinaryOp::Max => minmax("max")?,
            BinaryOp::And => b.build_and(x, y, "")?,
            BinaryOp::Or => b.build_or(x, y, "")?,
            BinaryOp::Xor => b.build_xor(x, y, "")?,
            BinaryOp::Shl | BinaryOp::Shr => {
                let wide = b.build_int_compare(IntPredicate::UGE, y, ty.const_int(bits as u64, false), "")?;
                if op == BinaryOp::Shr && s {
                    let lim = ty.const_int(bits as u64 - 1, false);
                    let amt = b.build_select(wide, lim, y, "")?.into_int_value();
                    b.build_right_shift(x, amt, true, "")?
                } else {
                    let r = if op == BinaryOp::Shl {
                        b.build_left_shift(x, y, "")?
                    } else {
                        b.build_right_shift(x, y, false, "")?
                    };
                    b.build_select(wide, ty.const_zero(), r, "")?.into_int_value()
                }
            }
            BinaryOp::MulHi => match bits {
                32 | 64 => {
                    let n = match (bits, s) {
                        (32, true) => "llvm.nvvm.mulhi.i",
                        (32, false) => "llvm.nvvm.mulhi.ui",
                        (_, true) => "llvm.nvvm.mulhi.ll",
                        (_, false) => "llvm.nvvm.mulhi.ull",
                    };
                    self.call1(n, ty.into(), &[x.into(), y.into()])?.into_int_value()
                }
                _ => {
                    let wt = self.int_ty(bits * 2);
                    let xw = b.build_int_cast_sign_flag(x, wt, s, "")?;
                    let yw = b.build_int_cast_sign_flag(y, wt, s, "")?;
                    let p = b.build_int_mul(xw, yw, "")?;
                    let h = b.build_right_shift(p, wt.const_int(bits as u64, false), false, "")?;
                    b.build_int_truncate(h, ty, "")?
                }
            },
            BinaryOp::Pow => return Err(crate::Error::Invalid("`pow` on integers".into())),
        })
    }

    /// `p + off` elements of `pointee`.
    pub fn addptr(
        &self,
        p: BasicValueEnum<'ctx>,
        off: BasicValueEnum<'ctx>,
        off_d: DType,
        pointee: DType,
    ) -> Result<BasicValueEnum<'ctx>> {
        let i64t = self.ctx.i64_type();
        let o = off.into_int_value();
        let o = if o.get_type().get_bit_width() == 64 {
            o
        } else {
            self.b.build_int_cast_sign_flag(o, i64t, off_d.is_signed_int(), "")?
        };
        let et: BasicTypeEnum<'ctx> = mem_type(self.ctx, Elem::Scalar(pointee));
        // SAFETY: GEP only computes an address; it is dereferenced under the op's mask.
        let q = unsafe { self.b.build_gep(et, p.into_pointer_value(), &[o], "")? };
        Ok(q.into())
    }

    pub(super) fn lower_arith(&mut self, inst: Inst, op: ArithOp) -> Result<()> {
        let args = self.args(inst);
        let res = self.result(inst, 0)?;
        let rty = self.f.ty(res).clone();
        let ops: Vec<Regs<'ctx>> = args.iter().map(|&a| self.regs(a)).collect::<Result<_>>()?;
        let n = ops[0].len();
        let d = rty.dtype();
        let mut out = Vec::with_capacity(n);
        #[allow(clippy::needless_range_loop)] // Registers of several operands.
        for i in 0..n {
            let v: BasicValueEnum<'ctx> = match op {
                ArithOp::AddPtr => {
                    let off_d = self.f.ty(args[1]).dtype();
                    self.addptr(ops[0][i], ops[1][i], off_d, d)?
                }
                ArithOp::Binary(bop) if d.is_float() => {
                    let x = self.fwiden(ops[0][i], d)?;
                    let y = self.fwiden(ops[1][i], d)?;
                    let r = self.float_binary(bop, x, y)?;
                    self.fnarrow(r, d)?
                }
                ArithOp::Binary(bop) => {
                    if bop == BinaryOp::Pow {
                        return Err(self.bug(inst, "`pow` on integers"));
                    }
                    self.int_binary(bop, d, ops[0][i].into_int_value(), ops[1][i].into_int_value())?.into()
                }
                ArithOp::Unary(u) if d.is_float() => {
                    let x = self.fwiden(ops[0][i], d)?;
                    let r = self.float_unary(u, x)?;
                    self.fnarrow(r, d)?
                }
                ArithOp::Unary(u) => {
                    let x = ops[0][i].into_int_value();
                    let ty = x.get_type();
                    match u {
                        UnaryOp::Neg => self.b.build_int_sub(ty.const_zero(), x, "")?.into(),
                        UnaryOp::Not => self.b.build_not(x, "")?.into(),
                        UnaryOp::Abs if d.is_signed_int() => {
                            let name = format!("llvm.abs.i{}", ty.get_bit_width());
                            let f = self.ctx.bool_type().const_zero();
                            self.call1(&name, ty.into(), &[x.into(), f.into()])?
                        }
                        UnaryOp::Abs => x.into(),
                        _ => return Err(self.bug(inst, format!("`{}` on integers", u.name()))),
                    }
                }
                ArithOp::Dp4a => {
                    // Byte signedness from the operands' dtypes (see `ArithOp::Dp4a`).
                    let sign =
                        |v: dsl_core::Value| if self.f.ty(v).dtype() == DType::U32 { "u" } else { "s" };
                    let name = format!("llvm.nvvm.idp4a.{}.{}", sign(args[0]), sign(args[1]));
                    let i32t = self.ctx.i32_type();
                    self.call1(&name, i32t.into(), &[ops[0][i], ops[1][i], ops[2][i]])?
                }
                ArithOp::Fma => {
                    if !d.is_float() {
                        return Err(self.bug(inst, "`fma` on integers"));
                    }
                    let x = self.fwiden(ops[0][i], d)?;
                    let y = self.fwiden(ops[1][i], d)?;
                    let z = self.fwiden(ops[2][i], d)?;
                    let r = self.fintr("fma", &[x, y, z])?;
                    self.fnarrow(r, d)?
                }
            };
            out.push(v);
        }
        self.set(res, out);
        Ok(())
    }
}
