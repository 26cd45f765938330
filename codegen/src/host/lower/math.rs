//! Rounding and the math library, exactly as the interpreter does them.
//!
//! - f32 to f16/bf16 rounds to nearest even (`half::f16::from_f32`,
//!   `half::bf16::from_f32`: NaNs become quiet NaNs keeping their top
//!   payload bits); f16/bf16 to f32 is exact (NaNs quieted). f16 uses the
//!   CPU's conversions where it has them (x86 F16C, AArch64), which is what
//!   the `half` crate uses on such CPUs too; otherwise integer code that
//!   computes the same bits. bf16 is always integer code.
//! - f64 to f32/f16/bf16 (`narrow`): to f32 by `fptrunc`; to the halves by
//!   rounding to f32 with round-to-odd first, then to nearest even, which is
//!   one correct rounding (`dsl_core::dtype::f64_to_f32_odd`).
//! - Transcendentals are computed in f64 by LLVM's intrinsics, which call
//!   the C math library of the process (the interpreter's `f64::exp` and
//!   friends call the same functions), then narrowed once; `erf` calls the
//!   interpreter's own function. `exp` and `exp2` with f32, f16 or bf16
//!   results (softmax, attention, SiLU) are computed here instead, on whole
//!   vectors: Cody-Waite reduction to `|r| <= ln2 / 2` and a degree-13
//!   polynomial with FMAs, within about an ulp of f64 of the exact value;
//!   rounded to f32 that is the interpreter's value unless the exact value
//!   lies within that distance of an f32 rounding boundary (about one
//!   element in 2^28). f64 results keep the library call.

use super::Lower;
use crate::Result;
use crate::llvm::Values;
use dsl_core::DType;
use inkwell::intrinsics::Intrinsic;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, InstructionOpcode::*};
use inkwell::{FloatPredicate, IntPredicate};

impl<'ctx> Lower<'ctx, '_> {
    /// Calls the overloaded intrinsic `name` on `args`; the overload types
    /// are those of `overloads` (values whose types select the instance).
    pub(super) fn intrinsic(
        &self,
        name: &str,
        overloads: &[BasicTypeEnum<'ctx>],
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<Option<BasicValueEnum<'ctx>>> {
        let intr = Intrinsic::find(name)
            .ok_or_else(|| crate::Error::Llvm(format!("LLVM has no intrinsic `{name}`")))?;
        let decl = intr
            .get_declaration(self.module, overloads)
            .ok_or_else(|| crate::Error::Llvm(format!("no declaration of `{name}` for {overloads:?}")))?;
        let args: Vec<BasicMetadataValueEnum<'ctx>> = args.iter().map(|&a| a.into()).collect();
        let call = self.b.build_call(decl, &args, "")?;
        Ok(call.try_as_basic_value().basic())
    }

    /// An intrinsic overloaded on its first argument's type that returns a
    /// value (`llvm.fma`, `llvm.exp`, ...).
    pub(super) fn call1(&self, name: &str, args: &[BasicValueEnum<'ctx>]) -> Result<BasicValueEnum<'ctx>> {
        let ty = args[0].get_type();
        self.intrinsic(name, &[ty], args)?
            .ok_or_else(|| crate::Error::Llvm(format!("`{name}` returned no value")))
    }

    /// `x` (f32 storage, scalar or vector) rounded to `d` (f16 or bf16;
    /// unchanged for f32).
    pub(super) fn round_half(&self, d: DType, x: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        match d {
            DType::F16 | DType::BF16 => {
                let bits = self.f32_to_half_bits(d, x)?;
                self.half_bits_to_f32(d, bits)
            }
            _ => Ok(x),
        }
    }

    /// The 8-bit float code (`i8`) of the f32 value `x` in `d` (see
    /// [`crate::llvm::f32_to_f8_code`]).
    pub(super) fn f32_to_f8_bits(&self, d: DType, x: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let code = crate::llvm::f32_to_f8_code(self, x, d)?;
        self.cast_to(Trunc, code, self.ctx.i8_type().into())
    }

    /// The f32 value of the 8-bit float code `b` (`i8`) of `d`.
    pub(super) fn f8_bits_to_f32(&self, d: DType, b: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let code = self.cast_to(ZExt, b, self.ctx.i32_type().into())?;
        crate::llvm::f8_code_to_f32(self, code, d)
    }

    /// `x` (f32) rounded to the 8-bit float `d`, as f32.
    pub(super) fn round_f8(&self, d: DType, x: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let code = crate::llvm::f32_to_f8_code(self, x, d)?;
        crate::llvm::f8_code_to_f32(self, code, d)
    }

    /// The f16/bf16 bits (`i16`) of the f32 value `x`, rounded to nearest even.
    pub(super) fn f32_to_half_bits(&self, d: DType, x: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let i16t: BasicTypeEnum<'ctx> = self.ctx.i16_type().into();
        let i32t: BasicTypeEnum<'ctx> = self.ctx.i32_type().into();
        if d == DType::F16 && self.target.has_f16_conversions() {
            let h = self.cast_to(FPTrunc, x, self.ctx.f16_type().into())?;
            return self.cast_to(BitCast, h, i16t);
        }
        let w = self.cast_to(BitCast, x, i32t)?;
        let c = |v: u64| self.int_like(w, v);
        if d == DType::BF16 {
            // Round to nearest even on the top 16 bits; NaN keeps its top
            // payload bits and becomes quiet.
            let mag = self.bin(And, w, c(0x7fff_ffff)?)?;
            let nan = self.icmp(IntPredicate::UGT, mag, c(0x7f80_0000)?)?;
            let hi = self.bin(LShr, w, c(16)?)?;
            let qnan = self.bin(Or, hi, c(0x40)?)?;
            let rb = self.icmp(IntPredicate::NE, self.bin(And, w, c(0x8000)?)?, c(0)?)?;
            let sticky = self.icmp(IntPredicate::NE, self.bin(And, w, c(0x1_7fff)?)?, c(0)?)?;
            let up = self.bin(And, rb, sticky)?;
            let up = self.cast_to(ZExt, up, i32t)?;
            let r = self.bin(Add, hi, up)?;
            let r = self.select(nan, qnan, r)?;
            return self.cast_to(Trunc, r, i16t);
        }
        self.f32_to_f16_soft(w)
    }

    /// f16 bits of the f32 bits `w` without hardware conversions: the
    /// `half` crate's rounding, lane by lane in integer code.
    fn f32_to_f16_soft(&self, w: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let i16t: BasicTypeEnum<'ctx> = self.ctx.i16_type().into();
        let c = |v: u64| self.int_like(w, v);
        let sign = self.bin(And, w, c(0x8000_0000)?)?;
        let exp = self.bin(And, w, c(0x7f80_0000)?)?;
        let man = self.bin(And, w, c(0x007f_ffff)?)?;
        let hsign = self.bin(LShr, sign, c(16)?)?;
        // Inf / NaN.
        let is_special = self.icmp(IntPredicate::EQ, exp, c(0x7f80_0000)?)?;
        let nan_bit = self.select(self.icmp(IntPredicate::EQ, man, c(0)?)?, c(0)?, c(0x200)?)?;
        let special = self.bin(
            Or,
            self.bin(Or, hsign, c(0x7c00)?)?,
            self.bin(Or, nan_bit, self.bin(LShr, man, c(13)?)?)?,
        )?;
        // half_exp = (exp >> 23) - 127 + 15, as a signed 32-bit value.
        let hexp = self.bin(Sub, self.bin(LShr, exp, c(23)?)?, c(112)?)?;
        let overflow = self.icmp(IntPredicate::SGE, hexp, c(0x1f)?)?;
        let inf = self.bin(Or, hsign, c(0x7c00)?)?;
        // Normal: round the mantissa to 10 bits, carrying into the exponent.
        let hexp_bits = self.bin(Shl, hexp, c(10)?)?;
        let hman = self.bin(LShr, man, c(13)?)?;
        let rbit = self.icmp(IntPredicate::NE, self.bin(And, man, c(0x1000)?)?, c(0)?)?;
        let sticky = self.icmp(IntPredicate::NE, self.bin(And, man, c(0x2fff)?)?, c(0)?)?;
        let up = self.cast_to(ZExt, self.bin(And, rbit, sticky)?, self.ctx.i32_type().into())?;
        let normal = self.bin(Add, self.bin(Or, hsign, self.bin(Or, hexp_bits, hman)?)?, up)?;
        // Subnormal (half_exp <= 0): shift in the hidden bit, round.
        let is_sub = self.icmp(IntPredicate::SLE, hexp, c(0)?)?;
        let shift = self.bin(Sub, c(14)?, hexp)?;
        let too_small = self.icmp(IntPredicate::SGT, shift, c(24)?)?;
        let shift_c = self.select(too_small, c(24)?, shift)?;
        let m = self.bin(Or, man, c(0x0080_0000)?)?;
        let sm = self.bin(LShr, m, shift_c)?;
        let rshift = self.bin(Sub, shift_c, c(1)?)?;
        let rb = self.bin(Shl, c(1)?, rshift)?;
        let has_r = self.icmp(IntPredicate::NE, self.bin(And, m, rb)?, c(0)?)?;
        let mask3 = self.bin(Sub, self.bin(Mul, rb, c(3)?)?, c(1)?)?;
        let st = self.icmp(IntPredicate::NE, self.bin(And, m, mask3)?, c(0)?)?;
        let up2 = self.cast_to(ZExt, self.bin(And, has_r, st)?, self.ctx.i32_type().into())?;
        let sub = self.bin(Or, hsign, self.bin(Add, sm, up2)?)?;
        let sub = self.select(too_small, hsign, sub)?;
        let r = self.select(is_sub, sub, normal)?;
        let r = self.select(overflow, inf, r)?;
        let r = self.select(is_special, special, r)?;
        self.cast_to(Trunc, r, i16t)
    }

    /// The f32 value of f16/bf16 bits (`i16`), exact (NaNs quieted).
    pub(super) fn half_bits_to_f32(&self, d: DType, h: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let f32t: BasicTypeEnum<'ctx> = self.ctx.f32_type().into();
        let i32t: BasicTypeEnum<'ctx> = self.ctx.i32_type().into();
        if d == DType::F16 && self.target.has_f16_conversions() {
            let x = self.cast_to(BitCast, h, self.ctx.f16_type().into())?;
            return self.cast_to(FPExt, x, f32t);
        }
        let w = self.cast_to(ZExt, h, i32t)?;
        let c = |v: u64| self.int_like(w, v);
        if d == DType::BF16 {
            let nan = self.icmp(IntPredicate::UGT, self.bin(And, w, c(0x7fff)?)?, c(0x7f80)?)?;
            let q = self.select(nan, self.bin(Or, w, c(0x40)?)?, w)?;
            let bits = self.bin(Shl, q, c(16)?)?;
            return self.cast_to(BitCast, bits, f32t);
        }
        // f16 without hardware: sign, exponent rebias, subnormals
        // normalized with a leading-zero count, Inf/NaN (quieted).
        let sign = self.bin(Shl, self.bin(And, w, c(0x8000)?)?, c(16)?)?;
        let hexp = self.bin(And, w, c(0x7c00)?)?;
        let hman = self.bin(And, w, c(0x03ff)?)?;
        let zero = self.icmp(IntPredicate::EQ, self.bin(And, w, c(0x7fff)?)?, c(0)?)?;
        let special = self.icmp(IntPredicate::EQ, hexp, c(0x7c00)?)?;
        let man_zero = self.icmp(IntPredicate::EQ, hman, c(0)?)?;
        let inf = self.bin(Or, sign, c(0x7f80_0000)?)?;
        let nan = self.bin(Or, self.bin(Or, sign, c(0x7fc0_0000)?)?, self.bin(Shl, hman, c(13)?)?)?;
        let normal = self.bin(
            Or,
            sign,
            self.bin(
                Or,
                self.bin(Shl, self.bin(Add, self.bin(LShr, hexp, c(10)?)?, c(112)?)?, c(23)?)?,
                self.bin(Shl, hman, c(13)?)?,
            )?,
        )?;
        // Subnormal: e = clz16(man) - 6; exp = 127 - 15 - e; man << (14 + e).
        let lz = self.call1("llvm.ctlz", &[hman, self.ctx.bool_type().const_zero().into()])?;
        let e = self.bin(Sub, lz, c(22)?)?;
        let sexp = self.bin(Shl, self.bin(Sub, c(112)?, e)?, c(23)?)?;
        let sman = self.bin(And, self.bin(Shl, hman, self.bin(Add, e, c(14)?)?)?, c(0x7f_ffff)?)?;
        let sub = self.bin(Or, sign, self.bin(Or, sexp, sman)?)?;
        let is_sub = self.icmp(IntPredicate::EQ, hexp, c(0)?)?;
        let r = self.select(is_sub, sub, normal)?;
        let r = self.select(special, self.select(man_zero, inf, nan)?, r)?;
        let r = self.select(zero, sign, r)?;
        self.cast_to(BitCast, r, f32t)
    }

    /// The f64 value `x` rounded once to the f32 storage of `d` (f32, f16 or
    /// bf16): the interpreter's `narrow_f64`.
    pub(super) fn narrow(&self, d: DType, x: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let f32t: BasicTypeEnum<'ctx> = self.ctx.f32_type().into();
        match d {
            DType::F16 | DType::BF16 => {
                let odd = self.f64_to_f32_odd(x)?;
                self.round_half(d, odd)
            }
            _ => self.cast_to(FPTrunc, x, f32t),
        }
    }

    /// `dsl_core::dtype::f64_to_f32_odd`: the nearest f32 toward zero with
    /// its last bit set when inexact; overflow gives the largest finite f32.
    fn f64_to_f32_odd(&self, x: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let f32t: BasicTypeEnum<'ctx> = self.ctx.f32_type().into();
        let f64t: BasicTypeEnum<'ctx> = self.ctx.f64_type().into();
        let i32t: BasicTypeEnum<'ctx> = self.ctx.i32_type().into();
        let r = self.cast_to(FPTrunc, x, f32t)?;
        let back = self.cast_to(FPExt, r, f64t)?;
        let ax = self.call1("llvm.fabs", &[x])?;
        let ar = self.call1("llvm.fabs", &[r])?;
        let aback = self.call1("llvm.fabs", &[back])?;
        let inf32 = self.float_like(r, f64::INFINITY)?;
        let inf64 = self.float_like(x, f64::INFINITY)?;
        let r_inf = self.fcmp(FloatPredicate::OEQ, ar, inf32)?;
        let x_finite = self.fcmp(FloatPredicate::OLT, ax, inf64)?;
        let overflow = self.bin(And, r_inf, x_finite)?;
        let exact = self.fcmp(FloatPredicate::OEQ, back, x)?;
        let x_nan = self.fcmp(FloatPredicate::UNO, x, x)?;
        let keep = self.bin(Or, self.bin(Or, exact, x_nan)?, r_inf)?;
        let bits = self.cast_to(BitCast, r, i32t)?;
        let away = self.fcmp(FloatPredicate::OGT, aback, ax)?;
        let away = self.cast_to(ZExt, away, i32t)?;
        let odd = self.bin(Or, self.bin(Sub, bits, away)?, self.int_like(bits, 1)?)?;
        let odd = self.cast_to(BitCast, odd, f32t)?;
        let max = self.float_like(r, f64::from(f32::MAX))?;
        let max = self.call1("llvm.copysign", &[max, r])?;
        let v = self.select(keep, r, odd)?;
        self.select(overflow, max, v)
    }

    /// `e^x` (`two`: `2^x`) of f64 values `x` (scalar or vector), for results
    /// narrowed to f32 or a half: arguments beyond the f32 range are clamped
    /// (the narrowed result is 0 or infinity either way); NaN stays NaN.
    pub(super) fn exp_f64(&self, x: BasicValueEnum<'ctx>, two: bool) -> Result<BasicValueEnum<'ctx>> {
        let c = |v: f64| self.float_like(x, v);
        let limit = if two { 160.0 } else { 111.0 };
        let hi = self.fcmp(FloatPredicate::OGT, x, c(limit)?)?;
        let lo = self.fcmp(FloatPredicate::OLT, x, c(-limit)?)?;
        let xc = self.select(hi, c(limit)?, x)?;
        let xc = self.select(lo, c(-limit)?, xc)?;
        let nan = self.fcmp(FloatPredicate::UNO, x, x)?;
        // x = n + r (2^x) or n ln2 + r (e^x), n an integer, |r| <= ln2 / 2.
        let (n, r) = if two {
            let n = self.call1("llvm.roundeven", &[xc])?;
            (n, self.bin(FSub, xc, n)?)
        } else {
            let n = self.call1("llvm.roundeven", &[self.bin(FMul, xc, c(std::f64::consts::LOG2_E)?)?])?;
            // ln 2 in two parts: n * LN2_HI is exact for |n| < 2^11.
            let nn = self.fneg(n)?;
            let r = self.call1("llvm.fma", &[nn, c(f64::from_bits(0x3fe6_2e42_fee0_0000))?, xc])?;
            (n, self.call1("llvm.fma", &[nn, c(f64::from_bits(0x3dea_39ef_3579_3c76))?, r])?)
        };
        // e^r = sum r^k / k! (2^r: (r ln2)^k / k!), Horner's scheme from degree 13.
        let coef = |k: i32| {
            let f: f64 = (1..=k).map(f64::from).product();
            let l = if two { std::f64::consts::LN_2.powi(k) } else { 1.0 };
            l / f
        };
        let mut p = c(coef(13))?;
        for k in (0..13).rev() {
            p = self.call1("llvm.fma", &[p, r, c(coef(k))?])?;
        }
        // Times 2^n, from the exponent bits (|n| <= 230: a normal f64).
        let n = self.select(nan, c(0.0)?, n)?;
        let i64t: BasicTypeEnum<'ctx> = self.ctx.i64_type().into();
        let ni = self.cast_to(FPToSI, n, i64t)?;
        let e = self.bin(Shl, self.bin(Add, ni, self.int_like(ni, 1023)?)?, self.int_like(ni, 52)?)?;
        let scale = self.cast_to(BitCast, e, self.ctx.f64_type().into())?;
        let y = self.bin(FMul, p, scale)?;
        self.select(nan, x, y)
    }

    /// `fcmp` on scalars or vectors alike.
    pub(super) fn fcmp(
        &self,
        p: FloatPredicate,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        Ok(match (a, b) {
            (BasicValueEnum::FloatValue(x), BasicValueEnum::FloatValue(y)) => {
                self.b.build_float_compare(p, x, y, "")?.into()
            }
            (BasicValueEnum::VectorValue(x), BasicValueEnum::VectorValue(y)) => {
                self.b.build_float_compare(p, x, y, "")?.into()
            }
            _ => return Err(crate::Error::Llvm("host lowering: fcmp of mismatched operands".into())),
        })
    }

    /// Applies the f64 function of the math library `name` (`llvm.exp`,
    /// ...) to `x` (f64, scalar or vector), or the interpreter's `erf`.
    pub(super) fn libm(&self, name: &str, x: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        if name != "erf" {
            return self.call1(name, &[x]);
        }
        let f64t = self.ctx.f64_type();
        let erf = match self.module.get_function(super::super::jit::ERF_SYMBOL) {
            Some(f) => f,
            None => self.module.add_function(
                super::super::jit::ERF_SYMBOL,
                f64t.fn_type(&[f64t.into()], false),
                None,
            ),
        };
        let call = |v: BasicValueEnum<'ctx>| -> Result<BasicValueEnum<'ctx>> {
            self.b
                .build_call(erf, &[v.into()], "")?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| crate::Error::Llvm("erf returned no value".into()))
        };
        match self.lanes_of(x) {
            None => call(x),
            Some(n) => {
                let mut parts = Vec::with_capacity(n as usize);
                for l in 0..n {
                    parts.push(call(self.lane(x, l)?)?);
                }
                Ok(self.gather_lanes(f64t.into(), &parts)?.into())
            }
        }
    }
}
