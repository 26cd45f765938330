//! Mappings from the tile IR to LLVM that the NVPTX lowering (`lower`) and
//! the host lowering (`host::lower`) share.

use crate::Result;
use dsl_core::dtype::DType;
use dsl_core::ir::ops::CmpPred;
use inkwell::context::Context;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, InstructionOpcode};
use inkwell::{FloatPredicate, IntPredicate};

/// The LLVM type of a scalar of dtype `d` (`i1` as `i1`, halves as `half`
/// and `bfloat`).
pub(crate) fn scalar_type(ctx: &Context, d: DType) -> BasicTypeEnum<'_> {
    match d {
        DType::I1 => ctx.bool_type().into(),
        // The 8-bit floats are held as their code: casts convert explicitly.
        DType::I8 | DType::U8 | DType::F8E4M3 | DType::F8E5M2 => ctx.i8_type().into(),
        DType::I16 => ctx.i16_type().into(),
        DType::I32 | DType::U32 => ctx.i32_type().into(),
        DType::I64 => ctx.i64_type().into(),
        DType::F16 => ctx.f16_type().into(),
        DType::BF16 => ctx.bf16_type().into(),
        DType::F32 => ctx.f32_type().into(),
        DType::F64 => ctx.f64_type().into(),
    }
}

/// The integer predicate of `cmp p` on operands of the given signedness.
pub(crate) fn int_predicate(p: CmpPred, signed: bool) -> IntPredicate {
    match (p, signed) {
        (CmpPred::Eq, _) => IntPredicate::EQ,
        (CmpPred::Ne, _) => IntPredicate::NE,
        (CmpPred::Lt, true) => IntPredicate::SLT,
        (CmpPred::Le, true) => IntPredicate::SLE,
        (CmpPred::Gt, true) => IntPredicate::SGT,
        (CmpPred::Ge, true) => IntPredicate::SGE,
        (CmpPred::Lt, false) => IntPredicate::ULT,
        (CmpPred::Le, false) => IntPredicate::ULE,
        (CmpPred::Gt, false) => IntPredicate::UGT,
        (CmpPred::Ge, false) => IntPredicate::UGE,
    }
}

/// The float predicate of `cmp p`: ordered, except `ne`, which is unordered
/// (true with NaN).
pub(crate) fn float_predicate(p: CmpPred) -> FloatPredicate {
    match p {
        CmpPred::Eq => FloatPredicate::OEQ,
        CmpPred::Ne => FloatPredicate::UNE,
        CmpPred::Lt => FloatPredicate::OLT,
        CmpPred::Le => FloatPredicate::OLE,
        CmpPred::Gt => FloatPredicate::OGT,
        CmpPred::Ge => FloatPredicate::OGE,
    }
}

/// The integer predicate under which `b` beats `a` in a running maximum
/// (`max`: `b > a`) or minimum (`b < a`).
pub(crate) fn int_order(max: bool, signed: bool) -> IntPredicate {
    int_predicate(if max { CmpPred::Gt } else { CmpPred::Lt }, signed)
}

/// The value-level builder operations the software 8-bit float conversions
/// need, on scalars (the NVPTX lowering) or on vectors lane by lane (the
/// host lowering): constants take the shape of the value they combine with.
pub(crate) trait Values<'ctx> {
    /// `op a b` (an integer or float binary instruction).
    fn bin(&self, op: InstructionOpcode, a: BV<'ctx>, b: BV<'ctx>) -> Result<BV<'ctx>>;
    /// `icmp p a b`.
    fn icmp(&self, p: IntPredicate, a: BV<'ctx>, b: BV<'ctx>) -> Result<BV<'ctx>>;
    /// `select c a b`.
    fn select(&self, c: BV<'ctx>, a: BV<'ctx>, b: BV<'ctx>) -> Result<BV<'ctx>>;
    /// The integer constant `c` shaped like `v`.
    fn int_like(&self, v: BV<'ctx>, c: u64) -> Result<BV<'ctx>>;
    /// The float constant `c` shaped like `v`.
    fn float_like(&self, v: BV<'ctx>, c: f64) -> Result<BV<'ctx>>;
    /// A cast instruction to element type `to`, shaped like `v`.
    fn cast_to(&self, op: InstructionOpcode, v: BV<'ctx>, to: BasicTypeEnum<'ctx>) -> Result<BV<'ctx>>;
    /// The context.
    fn context(&self) -> &'ctx Context;
}

/// A value of the [`Values`] operations (and of their implementations).
pub(crate) type BV<'ctx> = BasicValueEnum<'ctx>;

/// An 8-bit float format: mantissa bits, exponent bias, the f32 bits of its
/// largest finite value and of its smallest normal one, the code of the
/// largest finite value.
struct F8Format {
    mbits: u64,
    bias: u64,
    max_bits: u64,
    min_normal_bits: u64,
    max_code: u64,
}

fn f8_format(d: DType) -> F8Format {
    if d == DType::F8E4M3 {
        F8Format {
            mbits: 3,
            bias: 7,
            max_bits: 448f32.to_bits().into(),
            min_normal_bits: 0x3c80_0000,
            max_code: 0x7e,
        }
    } else {
        F8Format {
            mbits: 2,
            bias: 15,
            max_bits: 57344f32.to_bits().into(),
            min_normal_bits: 0x3880_0000,
            max_code: 0x7b,
        }
    }
}

/// The code (an i32 in 0..=255, shaped like `x`) of the f32 value `x` in
/// the 8-bit float `d`, as `cvt.rn.satfinite` converts: NaN to `0x7f`,
/// magnitudes from the largest finite value up (infinities included) to it,
/// normal results by rounding the f32 bits to nearest even, subnormal ones
/// by one f32 addition that rounds to an integer count of the smallest
/// subnormal (exact scaling by a power of two, then round to nearest even
/// at 2^23); the sign is kept.
pub(crate) fn f32_to_f8_code<'ctx>(o: &impl Values<'ctx>, x: BV<'ctx>, d: DType) -> Result<BV<'ctx>> {
    use InstructionOpcode::*;
    let f = f8_format(d);
    let ctx = o.context();
    let w = o.cast_to(BitCast, x, ctx.i32_type().into())?;
    let c = |v: u64| o.int_like(w, v);
    let sign = o.bin(And, o.bin(LShr, w, c(24)?)?, c(0x80)?)?;
    let mag = o.bin(And, w, c(0x7fff_ffff)?)?;
    let nan = o.icmp(IntPredicate::UGT, mag, c(0x7f80_0000)?)?;
    let sat = o.icmp(IntPredicate::UGE, mag, c(f.max_bits)?)?;
    let normal = o.icmp(IntPredicate::UGE, mag, c(f.min_normal_bits)?)?;
    let shift = 23 - f.mbits;
    let lsb = o.bin(And, o.bin(LShr, mag, c(shift)?)?, c(1)?)?;
    let up = o.bin(Add, o.bin(Add, mag, c((1 << (shift - 1)) - 1)?)?, lsb)?;
    let code_n = o.bin(Sub, o.bin(LShr, up, c(shift)?)?, c((127 - f.bias) << f.mbits)?)?;
    let a = o.cast_to(BitCast, mag, ctx.f32_type().into())?;
    let scaled = o.bin(FMul, a, o.float_like(a, 2f64.powi((f.bias - 1 + f.mbits) as i32))?)?;
    let t = o.bin(FAdd, scaled, o.float_like(a, 8_388_608.0)?)?;
    let code_s = o.bin(Sub, o.cast_to(BitCast, t, ctx.i32_type().into())?, c(0x4b00_0000)?)?;
    let code = o.select(normal, code_n, code_s)?;
    let code = o.select(sat, c(f.max_code)?, code)?;
    let code = o.select(nan, c(0x7f)?, code)?;
    o.bin(Or, code, sign)
}

/// The f32 value (shaped like `code`) of the 8-bit float code `code` (an
/// i32 in 0..=255) of `d`, exactly: normal codes rebias their exponent into
/// f32 bits, subnormal ones are their mantissa times the smallest
/// subnormal, E4M3's `S.1111.111` and E5M2's `S.11111.xx` with a non-zero
/// mantissa are the quiet NaN `0x7fc00000` of their sign (as the
/// interpreter reads them), E5M2's `S.11111.00` infinite.
pub(crate) fn f8_code_to_f32<'ctx>(o: &impl Values<'ctx>, code: BV<'ctx>, d: DType) -> Result<BV<'ctx>> {
    use InstructionOpcode::*;
    let f = f8_format(d);
    let ctx = o.context();
    let c = |v: u64| o.int_like(code, v);
    let sign = o.bin(Shl, o.bin(And, code, c(0x80)?)?, c(24)?)?;
    let ebits = 7 - f.mbits;
    let e = o.bin(And, o.bin(LShr, code, c(f.mbits)?)?, c((1 << ebits) - 1)?)?;
    let m = o.bin(And, code, c((1 << f.mbits) - 1)?)?;
    let man = o.bin(Shl, m, c(23 - f.mbits)?)?;
    let normal = o.bin(Or, o.bin(Shl, o.bin(Add, e, c(127 - f.bias)?)?, c(23)?)?, man)?;
    let mf = o.cast_to(UIToFP, m, ctx.f32_type().into())?;
    let sub = o.bin(FMul, mf, o.float_like(mf, 2f64.powi(1 - (f.bias + f.mbits) as i32))?)?;
    let sub = o.cast_to(BitCast, sub, ctx.i32_type().into())?;
    let bits = o.select(o.icmp(IntPredicate::EQ, e, c(0)?)?, sub, normal)?;
    let bits = if d == DType::F8E4M3 {
        let nan = o.icmp(IntPredicate::EQ, o.bin(And, code, c(0x7f)?)?, c(0x7f)?)?;
        o.select(nan, c(0x7fc0_0000)?, bits)?
    } else {
        let top = o.icmp(IntPredicate::EQ, e, c(0x1f)?)?;
        let special = o.select(o.icmp(IntPredicate::EQ, m, c(0)?)?, c(0x7f80_0000)?, c(0x7fc0_0000)?)?;
        o.select(top, special, bits)?
    };
    o.cast_to(BitCast, o.bin(Or, bits, sign)?, ctx.f32_type().into())
}
